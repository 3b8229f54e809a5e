//! The `sluice-server` binary as a child process.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

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

/// The binary running, its stderr piped; killed if dropped before [`ServerProcess::stop`], so
/// that a failed test leaves nothing running.
pub struct ServerProcess(Child);

impl ServerProcess {
    /// Starts `command`.
    pub fn start(command: &mut Command) -> ServerProcess {
        ServerProcess(command.stderr(Stdio::piped()).spawn().unwrap())
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// Stops it by SIGTERM; its exit must be clean. What it wrote to stderr, by line.
    pub async fn stop(mut self) -> Vec<String> {
        let status = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let stderr = self.0.stderr.take().unwrap();
        let lines: Vec<String> = tokio::task::spawn_blocking(move || {
            BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
                .collect()
        })
        .await
        .unwrap();
        let exit = self.0.wait().unwrap();
        assert!(exit.success(), "exit {exit:?}");
        lines
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // After `stop` it has exited and been waited for, and this does nothing.
        let _ = self.0.kill();
        let _ = self.0.wait();
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
