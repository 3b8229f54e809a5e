//! Settings: every one a flag and an environment variable (`SLUICE_*`), as given ([`Args`])
//! and validated ([`ServerConfig`]).

mod args;

pub use crate::flag_error::FlagError;
pub use args::{Args, DEFAULT_KEY_PREFIX, LogFormat, RlsHeaderStyle};

use std::sync::Arc;
use std::time::Duration;

use redis::{ClientTlsConfig, TlsCertificates};

use crate::pem;
use crate::rlqs::RlqsState;
use crate::rlqs::config::WatchedConfig as RlqsWatchedConfig;
use crate::rls::RlsState;
use crate::rls::config::WatchedConfig;
use crate::rls::descriptor_log::DescriptorLog;
use crate::store::{Credentials, ScriptCalls, Topology};
use crate::tls::{ListenerTls, TlsFiles, TlsFor};

/// Validated settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where Redis is.
    pub topology: Topology,
    /// The password and certificates the server presents to Redis.
    pub redis_credentials: Credentials,
    /// Timeout of every Redis call.
    pub redis_timeout: Duration,
    /// How scripts are called.
    pub script_calls: ScriptCalls,
    /// Redis key prefix.
    pub key_prefix: String,
    /// Bearer token.
    pub token: Option<String>,
    /// Whether `/metrics` asks for the bearer token too.
    pub metrics_need_token: bool,
    /// Replay mode.
    pub replay_time: bool,
    /// Shutdown grace.
    pub shutdown_grace: Duration,
    /// Envoy's gRPC rate limit service, with its configuration loaded.
    pub rls: Option<Arc<RlsState>>,
    /// Envoy's Rate Limit Quota Service, with its configuration loaded.
    pub rlqs: Option<Arc<RlqsState>>,
    /// TLS on the listeners.
    pub tls: Option<ListenerTls>,
    /// How long the server polls after each Redis call instead of sleeping, if it does
    /// ([`crate::busy_poll`]); each of the binary's threads polls its own event loop.
    pub busy_poll: Option<Duration>,
    /// How long a connection may pass nothing before it is closed.
    pub idle_timeout: Duration,
    /// How long a request may go from its first byte to the answer's first byte.
    pub request_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

impl ServerConfig {
    /// A configuration for a standalone Redis at `url`, with defaults elsewhere.
    pub fn standalone(url: impl Into<String>) -> ServerConfig {
        ServerConfig {
            topology: Topology::Standalone(url.into()),
            redis_credentials: Credentials::default(),
            redis_timeout: Duration::from_millis(100),
            script_calls: ScriptCalls::default(),
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            token: None,
            metrics_need_token: false,
            replay_time: false,
            shutdown_grace: Duration::from_secs(10),
            rls: None,
            rlqs: None,
            tls: None,
            busy_poll: None,
            idle_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(30),
            max_connections: 10_000,
        }
    }
}

impl TryFrom<&Args> for ServerConfig {
    type Error = FlagError;

    fn try_from(args: &Args) -> Result<ServerConfig, FlagError> {
        if args.grpc_listen.is_some() && args.rls_config.is_empty() && args.rlqs_config.is_empty() {
            return Err(FlagError::new(
                "--grpc-listen",
                "serves the gRPC APIs, and needs --rls-config or --rlqs-config",
            ));
        }
        if args.request_timeout.as_millis() <= args.redis_timeout.as_millis() {
            return Err(FlagError::RequestTimeout {
                request: args.request_timeout,
                redis: args.redis_timeout,
            });
        }
        let topology = if !args.redis_cluster.is_empty() {
            Topology::Cluster(args.redis_cluster.clone())
        } else if !args.redis_sentinel.is_empty() {
            let master = args.sentinel_master.clone().ok_or_else(|| {
                FlagError::new("--sentinel-master", "required with --redis-sentinel")
            })?;
            Topology::Sentinel {
                sentinels: args.redis_sentinel.clone(),
                master,
            }
        } else {
            Topology::Standalone(args.redis.clone())
        };
        topology.check()?;
        let redis_tls = redis_tls(args)?;
        if redis_tls.is_some() {
            let flag = if args.redis_ca_cert.is_some() {
                "--redis-ca-cert"
            } else {
                "--redis-client-cert"
            };
            if !topology.uses_tls() {
                return Err(FlagError::new(
                    flag,
                    format!(
                        "certificates for TLS, but {} gives no rediss:// URL",
                        topology.flag()
                    ),
                ));
            }
        }
        if args.redis_password.is_some() && topology.gives_password() {
            return Err(FlagError::new(
                "--redis-password",
                format!(
                    "{} gives a password too; give it in one place",
                    topology.flag()
                ),
            ));
        }
        if args.redis_password.as_deref() == Some("") {
            return Err(FlagError::new("--redis-password", "empty"));
        }
        if args.key_prefix.is_empty() || args.key_prefix.contains(['{', '}']) {
            return Err(FlagError::new(
                "--key-prefix",
                format!("`{}` must be non-empty and without braces", args.key_prefix),
            ));
        }
        if let Some(token) = &args.token
            && (token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(FlagError::new(
                "--token",
                "must be printable ASCII without spaces",
            ));
        }
        Ok(ServerConfig {
            topology,
            redis_credentials: Credentials {
                username: args.redis_username.clone(),
                password: args.redis_password.clone(),
                tls: redis_tls,
            },
            redis_timeout: Duration::from_millis(args.redis_timeout.as_millis()),
            script_calls: args.redis_scripts,
            key_prefix: args.key_prefix.clone(),
            token: args.token.clone(),
            metrics_need_token: args.metrics_need_token,
            replay_time: args.replay_time,
            shutdown_grace: Duration::from_millis(args.shutdown_grace.as_millis()),
            rls: rls_state(args)?,
            rlqs: rlqs_state(args)?,
            tls: listener_tls(args)?,
            busy_poll: (args.busy_poll_us > 0).then(|| Duration::from_micros(args.busy_poll_us)),
            idle_timeout: Duration::from_millis(args.idle_timeout.as_millis()),
            request_timeout: Duration::from_millis(args.request_timeout.as_millis()),
            max_connections: args.max_connections.max(1),
        })
    }
}

/// The certificates the TLS flags name, read and checked.
fn redis_tls(args: &Args) -> Result<Option<TlsCertificates>, FlagError> {
    let root_cert = args
        .redis_ca_cert
        .as_ref()
        .map(|path| pem::certificates("--redis-ca-cert", path).map(|(pem, _)| pem))
        .transpose()?;
    let client_tls = match (&args.redis_client_cert, &args.redis_client_key) {
        (Some(cert), Some(key)) => Some(ClientTlsConfig {
            client_cert: pem::certificates("--redis-client-cert", cert)?.0,
            client_key: pem::private_key("--redis-client-key", key)?.0,
        }),
        _ => None,
    };
    if root_cert.is_none() && client_tls.is_none() {
        return Ok(None);
    }
    Ok(Some(TlsCertificates {
        client_tls,
        root_cert,
    }))
}

/// TLS on the listeners, if a certificate is given.
fn listener_tls(args: &Args) -> Result<Option<ListenerTls>, FlagError> {
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        return Ok(None);
    };
    if args.tls_for == TlsFor::Grpc && args.grpc_listen.is_none() {
        return Err(FlagError::new(
            "--tls-for",
            "grpc puts TLS on --grpc-listen's listener alone, and none is given",
        ));
    }
    let files = TlsFiles {
        cert,
        key,
        client_ca: args.tls_client_ca.as_deref(),
        client_san: args.tls_client_san.as_deref(),
    };
    ListenerTls::from_files(files, args.tls_for).map(Some)
}

fn rlqs_state(args: &Args) -> Result<Option<Arc<RlqsState>>, FlagError> {
    if args.rlqs_config.is_empty() {
        return Ok(None);
    }
    let config = RlqsWatchedConfig::load(args.rlqs_config.clone())
        .map_err(|e| FlagError::new("--rlqs-config", e.to_string()))?;
    let mut rlqs = RlqsState::new(config, reload_every(args));
    rlqs.max_buckets_per_stream = args.rlqs_max_buckets_per_stream;
    rlqs.max_buckets = args.rlqs_max_buckets;
    rlqs.max_holders_per_bucket = args.rlqs_max_holders_per_bucket;
    Ok(Some(Arc::new(rlqs)))
}

fn rls_state(args: &Args) -> Result<Option<Arc<RlsState>>, FlagError> {
    if args.rls_config.is_empty() {
        return Ok(None);
    }
    let config = WatchedConfig::load(args.rls_config.clone())
        .map_err(|e| FlagError::new("--rls-config", e.to_string()))?;
    let mut rls = RlsState::new(
        config,
        args.rls_local_cache,
        args.rls_response_headers.into(),
        reload_every(args),
    );
    if let Some(path) = &args.rls_descriptor_log {
        rls.descriptor_log = Some(DescriptorLog::create(path).map_err(|e| {
            FlagError::new("--rls-descriptor-log", format!("{}: {e}", path.display()))
        })?);
    }
    Ok(Some(Arc::new(rls)))
}

/// How often both configurations' files are looked at (`--rls-reload-every`).
fn reload_every(args: &Args) -> Duration {
    Duration::from_millis(args.rls_reload_every.as_millis())
}
