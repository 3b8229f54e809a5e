//! What a replay runs against: a sluice-server in replay mode and its Redis, started here when
//! the user points at none, and stopped at the end.
//!
//! A server started here runs in this process, on the runtime that sends the callouts, and is
//! handed each callout as an HTTP request value: the same router, handlers and Redis, without
//! a socket, an HTTP/1 codec or a thread switch in between.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::BodyExt;
use sluice_core::rls::answer::RlsHeaders;
use sluice_harness::RedisServer;
use sluice_server::ServerConfig;
use sluice_server::rlqs::{self, RlqsState};
use sluice_server::rls::{self, RlsState};

use crate::connect::{Endpoint, HttpClient};

/// The configurations of the gRPC services a replay's server serves, loaded once by the
/// session (which reads them too) and handed over.
#[derive(Debug, Default)]
pub struct ServedConfigs {
    /// The rate limit service's (`--rls-config`).
    pub rls: Option<rls::config::WatchedConfig>,
    /// The quota service's (`--rlqs-config`).
    pub rlqs: Option<rlqs::config::WatchedConfig>,
}

/// A replay-mode server's settings against the Redis at `redis_url`. A replay decides in the
/// trace's time, so what it decides must not depend on how fast this machine answers: Redis is
/// given two seconds a call, not the 100 ms production's callers want.
pub fn replay_server_config(redis_url: impl Into<String>) -> ServerConfig {
    let mut config = ServerConfig::standalone(redis_url);
    config.replay_time = true;
    config.redis_timeout = Duration::from_secs(2);
    config
}

/// The server (and Redis) a replay talks to.
pub struct Services {
    redis: Option<RedisServer>,
    endpoint: Endpoint,
    /// The Redis and the key prefix of a server started here.
    keys: Option<(String, String)>,
}

impl Services {
    /// Uses `server` if given (it must run with `--replay-time`); otherwise starts one in this
    /// process, against `redis` if given, else against a redis-server started here (reached
    /// through its Unix socket), serving the gRPC services `served` configures.
    pub fn start(
        runtime: &tokio::runtime::Runtime,
        redis: Option<String>,
        server: Option<String>,
        served: ServedConfigs,
    ) -> anyhow::Result<Services> {
        if let Some(url) = server {
            let endpoint = Endpoint::from_url(&url);
            runtime.block_on(probe_replay_mode(&endpoint, &url))?;
            return Ok(Services {
                redis: None,
                endpoint,
                keys: None,
            });
        }
        let (started, redis_url) = match redis {
            Some(url) => (None, url),
            None => {
                let started = RedisServer::start()
                    .context("starting redis-server (install it, or pass --redis URL)")?;
                // Its Unix socket: the server is in this process, on this machine, and a
                // callout's round trip to Redis then skips the loopback TCP stack (measured:
                // about 1.2 times the replay rate).
                let url = started.unix_url().unwrap_or_else(|| started.url());
                (Some(started), url)
            }
        };
        let mut config = replay_server_config(redis_url.clone());
        // A Redis started here is empty and this run's alone, so its keys keep the server's
        // default names, and the memory report gives what production's keys take. In a Redis
        // the user gives, a fresh prefix per run: a replay must not read state an earlier one
        // left there. Fixed width, so that key sizes are the same run after run.
        if started.is_none() {
            config.key_prefix = format!(
                "sluice-sim-{:08x}{:016x}",
                std::process::id(),
                chrono::Utc::now().timestamp_micros()
            );
        }
        // A replay's limits do not change under it: its files are not read again.
        let never_reload = Duration::from_secs(24 * 3600);
        // No local over-limit cache: it answers by the wall clock, and a replay decides in the
        // trace's time.
        config.rls = served
            .rls
            .map(|rls| Arc::new(RlsState::new(rls, 0, RlsHeaders::default(), never_reload)));
        config.rlqs = served
            .rlqs
            .map(|rlqs| Arc::new(RlqsState::new(rlqs, never_reload)));
        let keys = Some((redis_url.clone(), config.key_prefix.clone()));
        let server = {
            let _entered = runtime.enter();
            sluice_server::in_process(config)
        };
        let endpoint = Endpoint::InProcess(server);
        runtime.block_on(wait_ready(&endpoint))?;
        Ok(Services {
            redis: started,
            endpoint,
            keys,
        })
    }

    /// How to reach the server.
    pub fn endpoint(&self) -> Endpoint {
        self.endpoint.clone()
    }

    /// Where the limit keys are: the Redis URL and the key prefix, when the server runs here.
    pub fn limit_keys(&self) -> Option<(&str, &str)> {
        self.keys
            .as_ref()
            .map(|(url, prefix)| (url.as_str(), prefix.as_str()))
    }

    /// The redis-server this replay started, if any.
    pub fn redis(&mut self) -> Option<&mut RedisServer> {
        self.redis.as_mut()
    }

    /// Stops what was started here.
    pub fn stop(mut self, runtime: &tokio::runtime::Runtime) {
        // The server's Redis connection closes on the runtime it was opened on.
        let _entered = runtime.enter();
        self.endpoint = Endpoint::NoHost;
        drop(self.redis.take());
    }
}

/// Sends one request to `endpoint`; the status and body.
async fn request(
    endpoint: &Endpoint,
    method: &str,
    path: &str,
    body: Vec<u8>,
    replay_time: Option<i64>,
) -> anyhow::Result<(u16, String)> {
    let authority = endpoint.authority("probe");
    let client = HttpClient::new(HashMap::from([(authority.clone(), endpoint.clone())]));
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("http://{authority}{path}"));
    if let Some(t) = replay_time {
        request = request.header(sluice_core::wire::REPLAY_TIME_HEADER, t.to_string());
    }
    let response = client
        .send(endpoint, request.body(Bytes::from(body))?)
        .await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Returns once the server at `endpoint` says it decides (`/readyz`: its Redis connection is
/// up); until then a callout would fail and the filter answer by its `failure_mode`.
pub async fn wait_ready(endpoint: &Endpoint) -> anyhow::Result<()> {
    let mut last = String::new();
    for _ in 0..200 {
        match request(endpoint, "GET", "/readyz", Vec::new(), None).await {
            Ok((200, _)) => return Ok(()),
            Ok((_, body)) => last = body,
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    bail!("sluice-server never became ready: {last}")
}

/// A server that takes its time from Redis would decide a replay in the wrong time.
async fn probe_replay_mode(endpoint: &Endpoint, url: &str) -> anyhow::Result<()> {
    let (status, body) = request(
        endpoint,
        "POST",
        sluice_core::wire::DECIDE_PATH,
        br#"{"checks":[]}"#.to_vec(),
        Some(0),
    )
    .await
    .with_context(|| format!("reaching sluice-server at {url}"))?;
    if body.contains(sluice_core::wire::REPLAY_TIME_HEADER) {
        bail!(
            "sluice-server at {url} is not in replay mode: start it with --replay-time (or SLUICE_REPLAY_TIME=true)"
        );
    }
    if status == 401 {
        bail!("sluice-server at {url} wants a bearer token; replays need a server without one");
    }
    wait_ready(endpoint).await
}
