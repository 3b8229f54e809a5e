//! One standalone `redis-server`.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::HarnessError;

/// How long a fresh server has to answer `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The Unix socket a server also listens on, in its directory.
const SOCKET_NAME: &str = "redis.sock";

/// The longest socket path Linux takes (`sun_path` is 108 bytes, NUL included).
const MAX_SOCKET_PATH: usize = 107;

/// A free TCP port on 127.0.0.1 (free when asked; another process may take it after).
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// A `redis-server` child process on 127.0.0.1, with its own directory; stopped on drop.
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    extra_args: Vec<String>,
    child: Option<Child>,
    /// `extra_args` start with a configuration file.
    config_file: bool,
}

impl RedisServer {
    /// Starts a server on a free port.
    pub fn start() -> Result<RedisServer, HarnessError> {
        RedisServer::start_with(&[])
    }

    /// Starts a server on a free port with extra `redis-server` arguments.
    pub fn start_with(extra_args: &[&str]) -> Result<RedisServer, HarnessError> {
        let extra_args: Vec<String> = extra_args.iter().map(|s| (*s).to_owned()).collect();
        // Another process may take the port between our probe and redis' bind: try again.
        let mut attempts = 0;
        loop {
            let mut server = RedisServer {
                port: free_port()?,
                dir: tempfile::Builder::new().prefix("sluice-redis-").tempdir()?,
                extra_args: extra_args.clone(),
                child: None,
                config_file: false,
            };
            match server.launch() {
                Ok(()) => return Ok(server),
                Err(e @ HarnessError::NotInstalled(_)) => return Err(e),
                Err(e) if attempts >= 4 => return Err(e),
                Err(_) => attempts += 1,
            }
        }
    }

    /// Starts `redis-server <config> <extra args>` on `port` in `dir` (a sentinel, for one).
    pub fn start_config(
        dir: tempfile::TempDir,
        port: u16,
        config: &Path,
        extra_args: &[&str],
    ) -> Result<RedisServer, HarnessError> {
        let mut args = vec![config.display().to_string()];
        args.extend(extra_args.iter().map(|s| (*s).to_owned()));
        let mut server = RedisServer {
            port,
            dir,
            extra_args: args,
            child: None,
            config_file: true,
        };
        server.launch()?;
        Ok(server)
    }

    fn launch(&mut self) -> Result<(), HarnessError> {
        let log = self.log_path();
        let mut command = Command::new("redis-server");
        if self.config_file {
            // A configuration file must come first; it sets the port itself.
            command.args(&self.extra_args);
        } else {
            command
                .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
                .arg("--dir")
                .arg(self.dir.path());
            if let Some(socket) = self.socket_path() {
                command
                    .arg("--unixsocket")
                    .arg(socket)
                    .args(["--unixsocketperm", "700"]);
            }
            command
                .args([
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--protected-mode",
                    "no",
                    "--daemonize",
                    "no",
                ])
                .args(&self.extra_args);
        }
        command
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command.spawn().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => HarnessError::NotInstalled("redis-server"),
            _ => HarnessError::Io(e),
        })?;
        self.child = Some(child);
        self.wait_until_answering()
    }

    fn wait_until_answering(&mut self) -> Result<(), HarnessError> {
        let started = Instant::now();
        while started.elapsed() < START_TIMEOUT {
            if ping(self.addr()) {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        self.kill();
        Err(HarnessError::NoAnswer {
            port: self.port,
            seconds: START_TIMEOUT.as_secs(),
            log: log
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n"),
        })
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The Unix socket it also listens on (none for a server started from a configuration
    /// file, or when the directory's path is too long for a socket).
    pub fn socket_path(&self) -> Option<PathBuf> {
        let path = self.dir.path().join(SOCKET_NAME);
        (!self.config_file && path.as_os_str().len() <= MAX_SOCKET_PATH).then_some(path)
    }

    /// `unix://<dir>/redis.sock`, the quickest way to it from this machine: no TCP stack on
    /// either side. `None` as for [`RedisServer::socket_path`].
    pub fn unix_url(&self) -> Option<String> {
        self.socket_path()
            .map(|path| format!("unix://{}", path.display()))
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// Whether it is running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Stops it (SIGKILL: a crash, as far as clients can tell). It can be started again.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and directory.
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        self.kill();
        self.launch()
    }

    /// Runs `redis-cli` against it and returns its output.
    pub fn cli(&self, args: &[&str]) -> Result<String, HarnessError> {
        redis_cli(self.port, args)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `redis-cli -p <port> <args>`.
pub(crate) fn redis_cli(port: u16, args: &[&str]) -> Result<String, HarnessError> {
    let output = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => HarnessError::NotInstalled("redis-cli"),
            _ => HarnessError::Io(e),
        })?;
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    Ok(text)
}

/// Whether a Redis answers at `addr`: `+PONG`, or `-NOAUTH` from one that wants a password.
pub(crate) fn ping(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && (&reply == b"+PONG\r\n" || &reply == b"-NOAUTH")
}
