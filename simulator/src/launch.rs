//! What a replay runs against: a sluice-server in replay mode and its Redis, started here when
//! the user points at none, and stopped at the end.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use sluice_harness::RedisServer;
use sluice_server::{RunningServer, ServerConfig};

/// The server (and Redis) a replay talks to.
pub struct Services {
    redis: Option<RedisServer>,
    server: Option<RunningServer>,
    server_url: String,
    redis_url: Option<String>,
}

impl Services {
    /// Uses `server` if given (it must run with `--replay-time`); otherwise starts one in this
    /// process, against `redis` if given, else against a redis-server started on a free port.
    pub async fn start(redis: Option<String>, server: Option<String>) -> anyhow::Result<Services> {
        if let Some(url) = server {
            let url = url.trim_end_matches('/').to_owned();
            probe_replay_mode(&url).await?;
            return Ok(Services {
                redis: None,
                server: None,
                server_url: url,
                redis_url: None,
            });
        }
        let (redis, redis_url) = match redis {
            Some(url) => (None, url),
            None => {
                let started = tokio::task::spawn_blocking(RedisServer::start)
                    .await
                    .context("starting redis-server")?
                    .context("starting redis-server (install it, or pass --redis URL)")?;
                let url = started.url();
                (Some(started), url)
            }
        };
        let mut config = ServerConfig::standalone(redis_url.clone());
        config.replay_time = true;
        config.redis_timeout = Duration::from_secs(2);
        // A fresh prefix per run: a replay must not read state an earlier one left in Redis.
        config.key_prefix = format!(
            "sluice-sim-{}-{}",
            std::process::id(),
            chrono::Utc::now().timestamp_micros()
        );
        let server = sluice_server::spawn(config, SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .context("starting sluice-server")?;
        let server_url = server.url();
        wait_ready(&server_url).await?;
        Ok(Services {
            redis,
            server: Some(server),
            server_url,
            redis_url: Some(redis_url),
        })
    }

    /// The server's base URL.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The Redis URL, when the replay started the server itself.
    pub fn redis_url(&self) -> Option<&str> {
        self.redis_url.as_deref()
    }

    /// The redis-server this replay started, if any.
    pub fn redis(&mut self) -> Option<&mut RedisServer> {
        self.redis.as_mut()
    }

    /// Stops what was started here.
    pub async fn stop(mut self) {
        if let Some(server) = self.server.take() {
            let _ = server.stop().await;
        }
        drop(self.redis.take());
    }
}

async fn get(url: &str) -> anyhow::Result<(u16, String)> {
    post(url, None, Vec::new(), None).await
}

async fn post(
    url: &str,
    method: Option<&str>,
    body: Vec<u8>,
    replay_time: Option<i64>,
) -> anyhow::Result<(u16, String)> {
    use http_body_util::{BodyExt, Full};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<bytes::Bytes>>();
    let mut request = http::Request::builder()
        .method(method.unwrap_or("GET"))
        .uri(url);
    if let Some(t) = replay_time {
        request = request.header(sluice_core::wire::REPLAY_TIME_HEADER, t.to_string());
    }
    let response = client
        .request(request.body(Full::new(bytes::Bytes::from(body)))?)
        .await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

async fn wait_ready(server_url: &str) -> anyhow::Result<()> {
    let mut last = String::new();
    for _ in 0..200 {
        match get(&format!("{server_url}/readyz")).await {
            Ok((200, _)) => return Ok(()),
            Ok((_, body)) => last = body,
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    bail!("sluice-server at {server_url} never became ready: {last}")
}

/// A server that takes its time from Redis would decide a replay in the wrong time.
async fn probe_replay_mode(server_url: &str) -> anyhow::Result<()> {
    let url = format!("{server_url}{}", sluice_core::wire::DECIDE_PATH);
    let (status, body) = post(&url, Some("POST"), br#"{"checks":[]}"#.to_vec(), Some(0))
        .await
        .with_context(|| format!("reaching sluice-server at {server_url}"))?;
    if body.contains(sluice_core::wire::REPLAY_TIME_HEADER) {
        bail!(
            "sluice-server at {server_url} is not in replay mode: start it with --replay-time (or SLUICE_REPLAY_TIME=true)"
        );
    }
    if status == 401 {
        bail!(
            "sluice-server at {server_url} wants a bearer token; replays need a server without one"
        );
    }
    wait_ready(server_url).await
}
