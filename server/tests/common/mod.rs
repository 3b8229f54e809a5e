//! Shared by the server's integration tests: a real Redis, a connected store, a server, HTTP.

#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)] // test support

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sluice_core::key::{LimitKey, RuleName, redis_key};
use sluice_core::limit::Limit;
use sluice_server::config::DEFAULT_KEY_PREFIX;
use sluice_server::store::{Credentials, ScriptCalls, Store, Topology};
use sluice_server::{RunningServer, ServerConfig};

pub use sluice_harness::certs;
pub mod load;
pub mod process;

/// A store connected to `topology`, waiting until Redis answers.
pub async fn connected_store(topology: Topology) -> Arc<Store> {
    connected_store_calling(topology, ScriptCalls::default()).await
}

/// As [`connected_store`], calling scripts as `calls` says.
pub async fn connected_store_calling(topology: Topology, calls: ScriptCalls) -> Arc<Store> {
    let store = Store::connect_calling(
        topology,
        Duration::from_secs(2),
        calls,
        Credentials::default(),
    );
    for _ in 0..200 {
        if store.time_us().await.is_ok() {
            return store;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("redis never answered");
}

/// Parses a limit written as JSON.
pub fn limit(json: &str) -> Limit {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{json}: {e}"))
}

/// An HTTP client (HTTP/1.1, or cleartext HTTP/2 with prior knowledge).
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

/// A response, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: String,
    /// The body as it came, for answers that are not text.
    pub body_bytes: Bytes,
    pub version: http::Version,
    pub content_type: String,
    pub content_length: Option<String>,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

impl Http {
    pub fn http1() -> Http {
        Http {
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub fn h2c() -> Http {
        Http {
            client: Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build_http(),
        }
    }

    pub async fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Answer {
        self.try_send(method, url, headers, body).await.unwrap()
    }

    /// As `send`, but a connection that fails is an error, not a panic.
    pub async fn try_send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<Answer, hyper_util::client::legacy::Error> {
        let mut request = http::Request::builder().method(method).uri(url);
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = self
            .client
            .request(request.body(Full::new(body.into())).unwrap())
            .await?;
        let status = response.status().as_u16();
        let version = response.version();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let content_length = response
            .headers()
            .get("content-length")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Ok(Answer {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
            body_bytes: body,
            version,
            content_type,
            content_length,
        })
    }

    pub async fn get(&self, url: &str) -> Answer {
        self.send("GET", url, &[], Bytes::new()).await
    }

    pub async fn decide(&self, server: &str, body: &str, headers: &[(&str, &str)]) -> Answer {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        self.send(
            "POST",
            &format!("{server}/v1/decide"),
            &all,
            body.to_owned(),
        )
        .await
    }
}

/// A server for `topology`, ready (Redis answering), with `tune` applied to its settings.
pub async fn server(topology: Topology, tune: impl FnOnce(&mut ServerConfig)) -> RunningServer {
    let mut config = ServerConfig::standalone("redis://unused");
    config.topology = topology;
    tune(&mut config);
    let server = sluice_server::spawn(config, ([127, 0, 0, 1], 0).into())
        .await
        .unwrap();
    let http = Http::http1();
    for _ in 0..400 {
        if http.get(&format!("{}/readyz", server.url())).await.status == 200 {
            return server;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the server never became ready");
}

/// A request body with one check of `limit` for `key` under rule `rule`.
pub fn one_check(rule: &str, key: &str, limit: &str) -> String {
    format!(r#"{{"checks":[{{"rule":"{rule}","key":"{key}","limit":{limit}}}]}}"#)
}

/// The Redis key the server keeps for `rule` and `key` under `limit` (JSON).
pub fn state_key(rule: &str, key: &str, limit_json: &str) -> String {
    prefixed_state_key(DEFAULT_KEY_PREFIX, rule, key, limit_json)
}

/// As [`state_key`], for a server whose keys start with `prefix`.
pub fn prefixed_state_key(prefix: &str, rule: &str, key: &str, limit_json: &str) -> String {
    redis_key(
        prefix,
        &RuleName::new(rule).unwrap(),
        &LimitKey::from_parts([key.as_bytes()]),
        &limit(limit_json),
    )
}

/// How many times Redis has run `command` (from INFO commandstats).
pub fn calls(redis: &sluice_harness::RedisServer, command: &str) -> u64 {
    info_count(redis, "commandstats", &format!("cmdstat_{command}:calls="))
}

/// How long, in microseconds, Redis has spent running `command` (from INFO commandstats).
pub fn usec(redis: &sluice_harness::RedisServer, command: &str) -> u64 {
    let info = redis.cli(&["INFO", "commandstats"]).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:")))
        .and_then(|rest| rest.split(',').find_map(|f| f.strip_prefix("usec=")))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// The bytes Redis has allocated (INFO memory's `used_memory`).
pub fn used_memory(redis: &sluice_harness::RedisServer) -> u64 {
    info_count(redis, "memory", "used_memory:")
}

/// How many times `redis` has answered the error `code` (from INFO errorstats).
pub fn errors(redis: &sluice_harness::RedisServer, code: &str) -> u64 {
    info_count(redis, "errorstats", &format!("errorstat_{code}:count="))
}

/// The count after `prefix` on a line of INFO's `section`; 0 where there is none.
fn info_count(redis: &sluice_harness::RedisServer, section: &str, prefix: &str) -> u64 {
    let info = redis.cli(&["INFO", section]).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|rest| rest.split(',').next()?.trim().parse().ok())
        .unwrap_or(0)
}
