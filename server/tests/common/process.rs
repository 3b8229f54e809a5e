//! The `sluice-server` binary as a child process.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::sync::mpsc;

use super::Http;

/// The binary cargo built for these tests.
pub const BINARY: &str = env!("CARGO_BIN_EXE_sluice-server");

/// Waits up to 5 s for the server on `port` to be ready, and asks it one decision.
pub async fn decide_once(port: u16) -> super::Answer {
    let url = format!("http://127.0.0.1:{port}");
    let http = Http::http1();
    let mut ready = false;
    for _ in 0..200 {
        if let Ok(Ok(answer)) = tokio::time::timeout(
            Duration::from_millis(200),
            http.try_send("GET", &format!("{url}/readyz"), &[], ""),
        )
        .await
            && answer.status == 200
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(ready, "the server never became ready");
    let limit = r#"{"algorithm":"gcra","rate":1,"per":"1s","burst":1}"#;
    http.decide(&url, &super::one_check("r", "k", limit), &[])
        .await
}

/// The binary running, its stderr read line by line as it comes; killed if dropped before
/// [`ServerProcess::stop`], so that a failed test leaves nothing running.
///
/// Give it `--listen 127.0.0.1:0` (or `SLUICE_LISTEN`) and ask [`ServerProcess::port`]: a port
/// probed free and then handed over is not enough. With more than one thread the server binds
/// its port with `SO_REUSEPORT`, so a second server handed the same port binds beside the first
/// without an error, and the kernel splits the connections between them. That is the likely
/// way a decision was answered "not connected yet (connecting)" by a server whose `/readyz` had
/// said ready (`make test`, 2026-12-03). Asked for port 0, the kernel picks one no socket holds,
/// `SO_REUSEPORT` or not (2,000 such binds here, all different).
pub struct ServerProcess {
    child: Child,
    said: mpsc::UnboundedReceiver<String>,
    /// The lines taken from `said` so far.
    lines: Vec<String>,
}

impl ServerProcess {
    /// Starts `command`.
    pub fn start(command: &mut Command) -> ServerProcess {
        let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (say, said) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if say.send(line).is_err() {
                    return;
                }
            }
        });
        ServerProcess {
            child,
            said,
            lines: Vec::new(),
        }
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The port it listens on, from the line it logs when it starts (text or JSON).
    pub async fn port(&mut self) -> u16 {
        let started = self.wait_for("sluice-server started").await;
        started
            .split_once("listen")
            .and_then(|(_, after)| after.split_once("127.0.0.1:"))
            .and_then(|(_, port)| {
                let digits = port
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(port.len());
                port[..digits].parse().ok()
            })
            .unwrap_or_else(|| panic!("no port in its start-up line: {started}"))
    }

    /// The first line it writes containing `needle`, waited for up to 10 s.
    pub async fn wait_for(&mut self, needle: &str) -> String {
        if let Some(line) = self.lines.iter().find(|l| l.contains(needle)) {
            return line.clone();
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let next = tokio::time::timeout_at(deadline, self.said.recv()).await;
            match next {
                Ok(Some(line)) => {
                    self.lines.push(line);
                    let line = &self.lines[self.lines.len() - 1];
                    if line.contains(needle) {
                        return line.clone();
                    }
                }
                Ok(None) => panic!("it exited without saying {needle:?}: {:#?}", self.lines),
                Err(_) => panic!("it did not say {needle:?} within 10 s: {:#?}", self.lines),
            }
        }
    }

    /// Stops it by SIGTERM; its exit must be clean. What it wrote to stderr, by line.
    pub async fn stop(mut self) -> Vec<String> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        // The reader ends when the process has closed its stderr.
        while let Some(line) = self.said.recv().await {
            self.lines.push(line);
        }
        let exit = self.child.wait().unwrap();
        assert!(exit.success(), "exit {exit:?}");
        std::mem::take(&mut self.lines)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // After `stop` it has exited and been waited for, and this does nothing.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The binary, given `args`, must stop at start-up with a message containing `expected`, and
/// without the tests' password in it. A server that takes the setting runs on: it is stopped
/// after 10 s, and the assertion fails.
pub fn assert_refused(args: &[&str], expected: &str) {
    let mut child = Command::new(BINARY)
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = reader.join().unwrap();
    let status = status.unwrap_or_else(|| panic!("{args:?} was taken: still running after 10 s"));
    assert!(!status.success(), "{args:?} was taken");
    assert!(stderr.contains(expected), "{args:?}: {stderr}");
    assert!(!stderr.contains("hunter2"), "{args:?}: {stderr}");
}
