//! The flags, as given: every one also an environment variable (`SLUICE_*`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use sluice_core::duration::Millis;
use sluice_core::rls::answer::RlsHeaders;

use crate::store::ScriptCalls;
use crate::tls::TlsFor;

/// The prefix of every Redis key when `--key-prefix` is not given.
pub const DEFAULT_KEY_PREFIX: &str = "sluice";

/// Command-line and environment settings, as given.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "sluice-server",
    version,
    about = "The sluice limit service: decides rate limits atomically in Redis."
)]
pub struct Args {
    /// Address to listen on (HTTP/1.1 and cleartext HTTP/2).
    #[arg(long, env = "SLUICE_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,

    /// A standalone Redis, as redis://host:port, with a user, password and db number if wanted
    /// (redis://user:password@host:port/db; rediss:// for TLS).
    #[arg(long, env = "SLUICE_REDIS", default_value = "redis://127.0.0.1:6379",
          conflicts_with_all = ["redis_cluster", "redis_sentinel"], hide_env_values = true)]
    pub redis: String,

    /// A Redis Cluster: comma-separated URLs of some of its nodes, each with the same scheme,
    /// user and password (and db number, where the Cluster has more than db 0: Valkey 9).
    #[arg(
        long,
        env = "SLUICE_REDIS_CLUSTER",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub redis_cluster: Vec<String>,

    /// Redis through Sentinel: comma-separated URLs of the sentinels (with --sentinel-master),
    /// each with the primary's db number if not 0 (redis://sentinel:26379/db).
    #[arg(
        long,
        env = "SLUICE_REDIS_SENTINEL",
        value_delimiter = ',',
        requires = "sentinel_master",
        hide_env_values = true
    )]
    pub redis_sentinel: Vec<String>,

    /// The name of the primary the sentinels monitor.
    #[arg(long, env = "SLUICE_SENTINEL_MASTER")]
    pub sentinel_master: Option<String>,

    /// The password of the Redis servers that hold the limits (the standalone one, every
    /// Cluster node, the primary behind Sentinel), instead of one in --redis's URL. A
    /// sentinel's own password goes in its URL.
    #[arg(long, env = "SLUICE_REDIS_PASSWORD", hide_env_values = true)]
    pub redis_password: Option<String>,

    /// The ACL user --redis-password is for (else `default`).
    #[arg(long, env = "SLUICE_REDIS_USERNAME", requires = "redis_password")]
    pub redis_username: Option<String>,

    /// PEM certificates of the authorities to trust for rediss:// URLs, instead of the
    /// system's.
    #[arg(long, env = "SLUICE_REDIS_CA_CERT")]
    pub redis_ca_cert: Option<PathBuf>,

    /// A PEM certificate (chain) to present to Redis over TLS, for a Redis that verifies its
    /// clients (tls-auth-clients, Redis' default); with --redis-client-key.
    #[arg(long, env = "SLUICE_REDIS_CLIENT_CERT", requires = "redis_client_key")]
    pub redis_client_cert: Option<PathBuf>,

    /// The PEM private key of --redis-client-cert.
    #[arg(long, env = "SLUICE_REDIS_CLIENT_KEY", requires = "redis_client_cert")]
    pub redis_client_key: Option<PathBuf>,

    /// Timeout of every Redis call (e.g. 50ms, 1s).
    #[arg(long, env = "SLUICE_REDIS_TIMEOUT", default_value = "100ms")]
    pub redis_timeout: Millis,

    /// How scripts are called: `functions` loads sluice's library into Redis (7.0 and later)
    /// and calls it by FCALL, falling back to EVALSHA where Redis will not; `eval` sends
    /// scripts by EVALSHA only.
    #[arg(
        long,
        env = "SLUICE_REDIS_SCRIPTS",
        value_enum,
        default_value = "functions"
    )]
    pub redis_scripts: ScriptCalls,

    /// Prefix of every Redis key sluice writes.
    #[arg(long, env = "SLUICE_KEY_PREFIX", default_value = DEFAULT_KEY_PREFIX)]
    pub key_prefix: String,

    /// A bearer token callers must present, as `Authorization: Bearer TOKEN`.
    #[arg(long, env = "SLUICE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// Ask for the bearer token on /metrics too (which shows rule names and descriptor keys).
    /// /healthz, /readyz and gRPC health never ask for it.
    #[arg(long, env = "SLUICE_METRICS_NEED_TOKEN", requires = "token")]
    pub metrics_need_token: bool,

    /// Accept the caller's time from the x-sluice-replay-time-us header (for replays only).
    #[arg(long, env = "SLUICE_REPLAY_TIME")]
    pub replay_time: bool,

    /// Log format.
    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Log filter, as RUST_LOG (e.g. info, sluice_server=debug). The default leaves out the
    /// Redis client's own warnings, one a slot refresh or failed connection attempt while a
    /// Cluster changes (info,redis=warn shows them).
    #[arg(long, env = "SLUICE_LOG", default_value = "info,redis=error", value_parser = log_filter)]
    pub log: String,

    /// How long shutdown waits for requests in flight.
    #[arg(long, env = "SLUICE_SHUTDOWN_GRACE", default_value = "10s")]
    pub shutdown_grace: Millis,

    /// Close a connection over which nothing has come or gone for this long: an idle
    /// keep-alive or HTTP/2 connection, or one that sent part of a request and stopped.
    #[arg(long, env = "SLUICE_IDLE_TIMEOUT", default_value = "30s")]
    pub idle_timeout: Millis,

    /// Close a connection whose client began a request this long ago and has had no byte of
    /// answer yet: one that trickles its request a byte at a time to hold the connection (a
    /// whole request is answered within the Redis timeout).
    #[arg(long, env = "SLUICE_REQUEST_TIMEOUT", default_value = "30s")]
    pub request_timeout: Millis,

    /// Connections served at once, over every listener; further ones wait in the listen
    /// backlog until one closes.
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,

    /// Connections the kernel holds for each listener before the server takes them (the
    /// kernel caps it at net.core.somaxconn).
    #[arg(long, env = "SLUICE_LISTEN_BACKLOG", default_value_t = 4096)]
    pub listen_backlog: u32,

    /// Threads serving requests; 0 for one per CPU. Each thread has its own event loop, its
    /// own socket on the port (the kernel spreads connections over them by their addresses)
    /// and its own Redis connection, so threads never wake one another: a connection's
    /// requests are all served by one thread. One thread sends the commands of requests that
    /// arrive together to Redis in one write, which costs least where Redis and the server
    /// share a few cores.
    #[arg(long, env = "SLUICE_THREADS", default_value_t = 0)]
    pub threads: usize,

    /// Keep polling the sockets for up to this many microseconds after each Redis call starts
    /// or ends, instead of sleeping (0: off; each thread polls its own). Under load the server is then
    /// awake when Redis' answers and callers' requests come, which raises its rate and lowers
    /// its latency, for CPU spent polling (sluice_busy_poll_seconds_total); idle, it sleeps.
    #[arg(long, env = "SLUICE_BUSY_POLL_US", default_value_t = 0)]
    pub busy_poll_us: u64,

    /// Serve Envoy's gRPC rate limit API (envoy.service.ratelimit.v3) with this configuration in
    /// the reference service's YAML: files, or directories of .yaml/.yml files
    /// (comma-separated).
    #[arg(long, env = "SLUICE_RLS_CONFIG", value_delimiter = ',')]
    pub rls_config: Vec<PathBuf>,

    /// Serve Envoy's Rate Limit Quota Service (envoy.service.rate_limit_quota.v3), for its
    /// `rate_limit_quota` filter, with this configuration (docs/rlqs.md): files, or directories
    /// of .yaml/.yml files (comma-separated).
    #[arg(long, env = "SLUICE_RLQS_CONFIG", value_delimiter = ',')]
    pub rlqs_config: Vec<PathBuf>,

    /// The most buckets one quota stream (one Envoy) may report; past it, a new bucket gets
    /// no assignment, and the Envoy applies its no_assignment_behavior to it.
    #[arg(long, env = "SLUICE_RLQS_MAX_BUCKETS_PER_STREAM", default_value_t = crate::rlqs::DEFAULT_MAX_BUCKETS_PER_STREAM)]
    pub rlqs_max_buckets_per_stream: usize,

    /// The most buckets all quota streams of this server may hold together.
    #[arg(long, env = "SLUICE_RLQS_MAX_BUCKETS", default_value_t = crate::rlqs::DEFAULT_MAX_BUCKETS)]
    pub rlqs_max_buckets: usize,

    /// The most quota streams (Envoys) one bucket may be shared by; past it, the bucket gets
    /// no assignment on a further stream until one of them leaves it.
    #[arg(long, env = "SLUICE_RLQS_MAX_HOLDERS_PER_BUCKET", default_value_t = crate::rlqs::DEFAULT_MAX_HOLDERS_PER_BUCKET)]
    pub rlqs_max_holders_per_bucket: u64,

    /// How often the rate limit and quota configurations' files are checked for changes.
    #[arg(long, env = "SLUICE_RLS_RELOAD_EVERY", default_value = "1s")]
    pub rls_reload_every: Millis,

    /// The rate limit headers gRPC answers ask Envoy to add to responses.
    #[arg(
        long,
        env = "SLUICE_RLS_RESPONSE_HEADERS",
        value_enum,
        default_value = "none"
    )]
    pub rls_response_headers: RlsHeaderStyle,

    /// How many over-limit counters the gRPC API remembers, to answer them without Redis until
    /// they could admit again; 0 turns the cache off.
    #[arg(long, env = "SLUICE_RLS_LOCAL_CACHE", default_value_t = 100_000)]
    pub rls_local_cache: usize,

    /// Write every ShouldRateLimit call's domain and descriptors to this file, a JSON line
    /// each: what Envoy's route actions send.
    #[arg(long, env = "SLUICE_RLS_DESCRIPTOR_LOG")]
    pub rls_descriptor_log: Option<PathBuf>,

    /// Serve the gRPC API on this address alone, not on --listen's.
    #[arg(long, env = "SLUICE_GRPC_LISTEN")]
    pub grpc_listen: Option<SocketAddr>,

    /// Serve TLS with this PEM certificate (chain), with --tls-key: on every listener, or on
    /// --grpc-listen's alone (--tls-for). HTTP/2 and HTTP/1.1 are offered by ALPN. Both files
    /// are read again when they change (looked at every 10 s).
    #[arg(long, env = "SLUICE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The PEM private key of --tls-cert.
    #[arg(long, env = "SLUICE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Require clients to present a certificate signed by these PEM authorities (mutual TLS).
    #[arg(long, env = "SLUICE_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Require the client's certificate to hold this name (a DNS name, which a wildcard in the
    /// certificate may cover, or an IP address); with --tls-client-ca.
    #[arg(long, env = "SLUICE_TLS_CLIENT_SAN", requires = "tls_client_ca")]
    pub tls_client_san: Option<String>,

    /// Which listeners TLS is on: `all`, or `grpc` for --grpc-listen's alone (--listen then
    /// stays cleartext, for probes, metrics and /v1/decide).
    #[arg(
        long,
        env = "SLUICE_TLS_FOR",
        value_enum,
        default_value = "all",
        requires = "tls_cert"
    )]
    pub tls_for: TlsFor,
}

/// The rate limit headers of gRPC answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RlsHeaderStyle {
    /// None.
    None,
    /// The reference service's RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset.
    Reference,
    /// The IETF draft's RateLimit-Policy and RateLimit.
    Ietf,
}

impl From<RlsHeaderStyle> for RlsHeaders {
    fn from(style: RlsHeaderStyle) -> RlsHeaders {
        match style {
            RlsHeaderStyle::None => RlsHeaders::None,
            RlsHeaderStyle::Reference => RlsHeaders::Reference,
            RlsHeaderStyle::Ietf => RlsHeaders::Ietf,
        }
    }
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// A log filter as `RUST_LOG` takes it, checked when the flags are read: one that does not
/// parse stops the server, rather than being put aside for a default.
fn log_filter(text: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(text)
        .map(|_| text.to_owned())
        .map_err(|e| e.to_string())
}
