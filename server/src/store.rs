//! The connection to Redis: standalone, Cluster or Sentinel, reconnecting by itself, with a
//! timeout on every call.
//!
//! The server starts whether or not Redis is up: until a first connection succeeds, calls fail
//! at once with [`StoreError::NotConnected`] (503) while a background task keeps trying. After
//! that, the `redis` crate's managers reconnect by themselves; a call made while Redis is away
//! fails within the timeout, and calls succeed again as soon as it is back.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use sluice_core::verdict::Verdict;
use tokio::sync::RwLock;

use crate::scripts::{BadReply, ScriptCall, decode_reply};

/// Where Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server (`redis://host:port/db`).
    Standalone(String),
    /// A Redis Cluster, from any of its nodes.
    Cluster(Vec<String>),
    /// A primary found through Sentinel.
    Sentinel {
        /// The sentinels' URLs.
        sentinels: Vec<String>,
        /// The monitored primary's name.
        master: String,
    },
}

/// A failed Redis call.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No connection has been made yet.
    #[error("redis: not connected yet ({0})")]
    NotConnected(String),
    /// The call took longer than the timeout.
    #[error("redis: no answer within {0:?}")]
    Timeout(Duration),
    /// Redis answered with an error, or the connection broke.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A script answered something else than its six numbers.
    #[error("redis: {0}")]
    BadReply(#[from] BadReply),
}

impl StoreError {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::NotConnected(_) => "not_connected",
            StoreError::Timeout(_) => "timeout",
            StoreError::Redis(_) => "error",
            StoreError::BadReply(_) => "bad_reply",
        }
    }
}

#[derive(Clone)]
enum Backend {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The shared Redis handle.
pub struct Store {
    topology: Topology,
    timeout: Duration,
    backend: RwLock<Option<Backend>>,
    last_error: RwLock<String>,
}

impl Store {
    /// A store for `topology`; connects in the background, retrying until it succeeds.
    pub fn connect(topology: Topology, timeout: Duration) -> Arc<Store> {
        let store = Arc::new(Store {
            topology,
            timeout,
            backend: RwLock::new(None),
            last_error: RwLock::new("connecting".to_owned()),
        });
        let background = Arc::clone(&store);
        tokio::spawn(async move { background.keep_connecting().await });
        store
    }

    async fn keep_connecting(&self) {
        let mut delay = Duration::from_millis(50);
        loop {
            match tokio::time::timeout(self.timeout.max(Duration::from_secs(1)), self.open()).await
            {
                Ok(Ok(backend)) => {
                    tracing::info!(topology = ?self.topology, "connected to redis");
                    *self.backend.write().await = Some(backend);
                    return;
                }
                Ok(Err(e)) => *self.last_error.write().await = e.to_string(),
                Err(_) => *self.last_error.write().await = "connection timed out".to_owned(),
            }
            let error = self.last_error.read().await.clone();
            tracing::warn!(%error, "redis unreachable; retrying");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }

    async fn open(&self) -> Result<Backend, StoreError> {
        match &self.topology {
            Topology::Standalone(url) => {
                let client = redis::Client::open(url.as_str())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeout.max(Duration::from_millis(250))))
                    .set_response_timeout(Some(self.timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(500));
                Ok(Backend::Standalone(
                    client.get_connection_manager_with_config(config).await?,
                ))
            }
            Topology::Cluster(urls) => {
                let client = ClusterClient::builder(urls.clone())
                    .connection_timeout(self.timeout.max(Duration::from_millis(250)))
                    .response_timeout(self.timeout)
                    .retries(1)
                    .build()?;
                Ok(Backend::Cluster(client.get_async_connection().await?))
            }
            Topology::Sentinel { .. } => Err(StoreError::NotConnected(
                "sentinel topology is not available in this build".to_owned(),
            )),
        }
    }

    async fn backend(&self) -> Result<Backend, StoreError> {
        match self.backend.read().await.as_ref() {
            Some(b) => Ok(b.clone()),
            None => Err(StoreError::NotConnected(
                self.last_error.read().await.clone(),
            )),
        }
    }

    /// Runs one script call, loading the script if Redis does not have it (after a restart,
    /// a `SCRIPT FLUSH` or a failover).
    pub async fn run(&self, call: &ScriptCall) -> Result<Verdict, StoreError> {
        let backend = self.backend().await?;
        let mut invocation = call.script().prepare_invoke();
        invocation.key(&call.key);
        for arg in &call.args {
            invocation.arg(arg);
        }
        let reply: Vec<i64> = self
            .within_timeout(async {
                match backend {
                    Backend::Standalone(mut c) => invocation.invoke_async(&mut c).await,
                    Backend::Cluster(mut c) => invocation.invoke_async(&mut c).await,
                }
            })
            .await?;
        Ok(decode_reply(reply)?)
    }

    /// Whether Redis answers a `PING` within the timeout.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let backend = self.backend().await?;
        self.within_timeout(async {
            let cmd = redis::cmd("PING");
            match backend {
                Backend::Standalone(mut c) => cmd.query_async::<String>(&mut c).await.map(drop),
                Backend::Cluster(mut c) => cmd.query_async::<String>(&mut c).await.map(drop),
            }
        })
        .await
    }

    async fn within_timeout<T>(
        &self,
        call: impl Future<Output = Result<T, redis::RedisError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}
