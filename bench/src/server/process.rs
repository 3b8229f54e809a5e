//! The servers the bench measures, as processes of their own: the release sluice-server and the
//! floor, started beside this binary and killed when done.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use sluice_harness::RedisServer;

use super::workload::{BUSY_POLL_US, KEYSPACE, LIMIT, Standin};

/// A server process started by the bench, killed when dropped.
pub(crate) struct ServerProcess(Child);

impl ServerProcess {
    /// The release `sluice-server` beside this binary, on `addr` over `redis`, with one
    /// thread (Redis and redis-benchmark run one each), polling for [`BUSY_POLL_US`] after
    /// each Redis call, and `extra` arguments.
    pub(crate) fn start(
        addr: SocketAddr,
        redis: &RedisServer,
        extra: &[&OsStr],
    ) -> anyhow::Result<ServerProcess> {
        let poll = BUSY_POLL_US.to_string();
        let flags = ["--busy-poll-us", &poll].map(OsStr::new);
        ServerProcess::sleeping(addr, redis, &[&flags, extra].concat())
    }

    /// As [`ServerProcess::start`], sleeping whenever it waits, as sluice-server does by
    /// default.
    pub(super) fn sleeping(
        addr: SocketAddr,
        redis: &RedisServer,
        extra: &[&OsStr],
    ) -> anyhow::Result<ServerProcess> {
        let flags = ["--log", "warn", "--threads", "1"].map(OsStr::new);
        ServerProcess::spawn("sluice-server", addr, redis, &[&flags, extra].concat())
    }

    /// The release `sluice-server` on `addr` over `redis`, logging warnings only, with
    /// `flags`.
    pub(crate) fn spawn_release(
        addr: SocketAddr,
        redis: &RedisServer,
        flags: &[&OsStr],
    ) -> anyhow::Result<ServerProcess> {
        let quiet = ["--log", "warn"].map(OsStr::new);
        ServerProcess::spawn("sluice-server", addr, redis, &[&quiet, flags].concat())
    }

    /// The floor (`bench/examples/floor.rs`, built beside this binary) on `addr` over `redis`,
    /// deciding the bench's limit for its keyspace, polling as sluice-server does.
    pub(super) fn floor(addr: SocketAddr, redis: &RedisServer) -> anyhow::Result<ServerProcess> {
        let keys = KEYSPACE.to_string();
        let poll = BUSY_POLL_US.to_string();
        let flags = ["--limit", LIMIT, "--keys", &keys, "--busy-poll-us", &poll].map(OsStr::new);
        ServerProcess::spawn("examples/floor", addr, redis, &flags)
    }

    /// `standin` on `addr` over `redis`.
    pub(super) fn standin(
        standin: Standin,
        addr: SocketAddr,
        redis: &RedisServer,
    ) -> anyhow::Result<ServerProcess> {
        match standin {
            Standin::Sleeping => ServerProcess::sleeping(addr, redis, &[]),
            Standin::Floor => ServerProcess::floor(addr, redis),
        }
    }

    /// `binary`, beside this one, listening on `addr` over `redis`, with `flags`.
    fn spawn(
        binary: &str,
        addr: SocketAddr,
        redis: &RedisServer,
        flags: &[&OsStr],
    ) -> anyhow::Result<ServerProcess> {
        let child = Command::new(sibling_binary(binary)?)
            .args(["--listen", &addr.to_string(), "--redis", &redis.url()])
            .args(flags)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {binary}"))?;
        Ok(ServerProcess(child))
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sibling_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe.with_file_name(name);
    if path.exists() {
        Ok(path)
    } else {
        bail!("{} not found: build it (make bench does)", path.display())
    }
}

/// Waits until the server on `addr` answers `/readyz` with 200.
pub(crate) async fn wait_ready(addr: SocketAddr) -> anyhow::Result<()> {
    for _ in 0..200 {
        if let Ok(stream) = tokio::net::TcpStream::connect(addr).await {
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
            tokio::spawn(conn);
            let request = http::Request::get("/readyz")
                .header(http::header::HOST, "sluice")
                .body(http_body_util::Empty::<Bytes>::new())?;
            if sender
                .send_request(request)
                .await
                .is_ok_and(|r| r.status() == http::StatusCode::OK)
            {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("sluice-server never became ready at {addr}")
}
