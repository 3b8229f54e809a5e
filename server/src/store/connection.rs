//! Connecting to Redis and staying connected: opening the backend (standalone, through
//! Sentinel, or a Cluster), refusing a server that cannot hold the limits, loading the
//! library, and following a Sentinel failover.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::IntoConnectionInfo;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;

use super::{
    Backend, CLUSTER_RETRIES, SENTINEL_REFRESH_INTERVAL, Store, StoreError, Topology, load_library,
    redacted, tcp_settings,
};
use crate::clock;
use crate::scripts::SCRIPTS;

impl Store {
    pub(super) async fn keep_connecting(&self) {
        let mut delay = Duration::from_millis(50);
        loop {
            match tokio::time::timeout(self.open_timeout(), self.open()).await {
                Ok(Ok(backend)) => {
                    // Loaded now, the library spares the first calls a miss; a failure that
                    // may pass is tried again when a call misses it.
                    if !self.eval_only.load(Ordering::Relaxed) {
                        let loaded =
                            tokio::time::timeout(self.timeout, load_library(backend.clone())).await;
                        match loaded {
                            Ok(Ok(())) => tracing::info!(
                                library = %SCRIPTS.library().name,
                                "scripts are called as Redis Functions"
                            ),
                            Ok(Err(e)) => self.functions_failed(&e),
                            Err(_) => tracing::warn!(
                                "loading the functions library timed out; trying again on the first call"
                            ),
                        }
                    }
                    // Said once calls may go: until the line above, they fail as not
                    // connected yet.
                    *self.backend.write().await = Some(backend);
                    if self.connected.send_replace(true) {
                        tracing::info!(topology = ?self.topology, "connected to redis again");
                    }
                    return;
                }
                Ok(Err(e)) => *self.last_error.write().await = e.to_string(),
                Err(_) => *self.last_error.write().await = "connection timed out".to_owned(),
            }
            let error = self.last_error.read().await.clone();
            tracing::warn!(%error, "redis not usable; retrying");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }

    /// How long opening a backend may take, with what it asks on the way (the sentinels, a
    /// Cluster's slots): the call's timeout, but not under 1 s.
    pub(super) fn open_timeout(&self) -> Duration {
        self.timeout.max(Duration::from_secs(1))
    }

    /// How long opening a connection may take: the call's timeout, but not under 250 ms.
    pub(super) fn connect_timeout(&self) -> Duration {
        self.timeout.max(Duration::from_millis(250))
    }

    /// The pause before the Redis client tries again, to reconnect or after a Cluster node
    /// refused a call for the moment (`TRYAGAIN` mid-reshard, `CLUSTERDOWN` until a replica
    /// takes over): a twentieth of a call's timeout, so that another try fits in it. The
    /// client's own pauses, 100 ms before reconnecting and 1.28 s on a Cluster, were as long
    /// as the default timeout or longer: calls waited it out instead of failing on a refused
    /// connection (a filter failing open then held its request that long) or succeeding on a
    /// second try.
    pub(super) fn retry_pause(&self) -> Duration {
        self.timeout / 20
    }

    pub(super) fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout()))
            // `within_timeout` bounds every call already. A second timer a call made tokio
            // write to its own eventfd for most calls (a timer due before the event loop's
            // next planned wake-up does), 1.5 writes a decision against 0.6 with one.
            .set_response_timeout(None)
            .set_number_of_retries(1)
            .set_min_delay(self.retry_pause())
            .set_max_delay(Duration::from_millis(500))
    }

    pub(super) async fn open(&self) -> Result<Backend, StoreError> {
        match &self.topology {
            Topology::Standalone(url) => {
                let info = self
                    .credentials
                    .log_in(url.as_str().into_connection_info()?)
                    .set_tcp_settings(tcp_settings());
                let client = match &self.credentials.tls {
                    Some(tls) => redis::Client::build_with_tls(info, tls.clone())?,
                    None => redis::Client::open(info)?,
                };
                let mut manager = client
                    .get_connection_manager_with_config(self.manager_config())
                    .await?;
                refuse_unfit_server(&mut manager, url).await?;
                Ok(Backend::Single(manager))
            }
            Topology::Cluster(urls) => {
                // The client counts its waits in whole milliseconds: the n-th is drawn from one
                // pause to `pause × 2^n`, and stays under a quarter of the timeout. It also
                // bounds a call and all its tries together by the timeout.
                let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
                let pause_ms = ms(self.retry_pause()).max(1);
                let mut builder = ClusterClient::builder(urls.clone())
                    .connection_timeout(self.connect_timeout())
                    .response_timeout(self.timeout)
                    .retries(CLUSTER_RETRIES)
                    .min_retry_wait(pause_ms)
                    .max_retry_wait(ms(self.timeout / 4).max(5))
                    .retry_wait_formula(pause_ms, 2)
                    .tcp_settings(tcp_settings());
                if let Some(username) = &self.credentials.username {
                    builder = builder.username(username);
                }
                if let Some(password) = &self.credentials.password {
                    builder = builder.password(password);
                }
                if let Some(tls) = &self.credentials.tls {
                    builder = builder.certs(tls.clone());
                }
                let client = builder.build()?;
                Ok(Backend::Cluster(client.get_async_connection().await?))
            }
            Topology::Sentinel { .. } => {
                let sentinel = self
                    .sentinel
                    .as_ref()
                    .ok_or_else(|| StoreError::NotConnected("bad sentinel configuration".into()))?;
                let client = sentinel.client.lock().await.async_get_client().await?;
                let primary = client.get_connection_info().addr().to_string();
                let manager = client
                    .get_connection_manager_with_config(self.manager_config())
                    .await?;
                *sentinel.primary.lock().await = primary;
                Ok(Backend::Single(manager))
            }
        }
    }

    /// After a failed call behind Sentinel: ask where the primary is, and follow it if it
    /// moved. Runs in the background, at most every [`SENTINEL_REFRESH_INTERVAL`].
    pub(super) fn follow_failover(self: &Arc<Self>) {
        let Some(sentinel) = &self.sentinel else {
            return;
        };
        if sentinel.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let store = Arc::clone(self);
        tokio::spawn(async move {
            let Some(sentinel) = &store.sentinel else {
                return;
            };
            let mut last = sentinel.last_refresh.lock().await;
            if let Some(at) = *last
                && at.elapsed() < SENTINEL_REFRESH_INTERVAL
            {
                tokio::time::sleep(SENTINEL_REFRESH_INTERVAL - at.elapsed()).await;
            }
            *last = Some(clock::monotonic());
            drop(last);
            let found = async {
                let client = sentinel.client.lock().await.async_get_client().await?;
                let primary = client.get_connection_info().addr().to_string();
                if *sentinel.primary.lock().await == primary {
                    return Ok::<_, redis::RedisError>(None);
                }
                let manager = client
                    .get_connection_manager_with_config(store.manager_config())
                    .await?;
                Ok(Some((primary, manager)))
            };
            match tokio::time::timeout(store.open_timeout(), found).await {
                Ok(Ok(Some((primary, manager)))) => {
                    tracing::info!(%primary, "following the primary Sentinel names");
                    *sentinel.primary.lock().await = primary;
                    *store.backend.write().await = Some(Backend::Single(manager));
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "asking the sentinels for the primary failed")
                }
                Err(_) => tracing::warn!("the sentinels did not answer in time"),
            }
            sentinel.refreshing.store(false, Ordering::Release);
        });
    }
}

/// Refuses one server given that cannot hold the limits, though it answers: a node of a
/// Cluster, which answers `MOVED` for the keys of the other nodes' slots, or a replica, which
/// refuses the scripts' writes. Either way most decisions would fail while the server said it
/// was ready. Checked until a first connection passes, so a replica promoted meanwhile is
/// taken then.
async fn refuse_unfit_server(manager: &mut ConnectionManager, url: &str) -> Result<(), StoreError> {
    // `INFO` with no section names has both these, on every version of Redis.
    let info: redis::RedisResult<String> = redis::cmd("INFO").query_async(manager).await;
    let info = match info {
        Ok(info) => info,
        // Where an ACL refuses `INFO`, the decisions' errors will tell.
        Err(e) if e.code() == Some("NOPERM") => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.trim_end().strip_prefix(name)?.strip_prefix(':'))
    };
    if field("cluster_enabled") == Some("1") {
        return Err(StoreError::ClusterNode(redacted(url)));
    }
    if matches!(field("role"), Some("slave" | "replica")) {
        let primary = format!(
            "{}:{}",
            field("master_host").unwrap_or("?"),
            field("master_port").unwrap_or("?")
        );
        return Err(StoreError::Replica {
            url: redacted(url),
            primary,
        });
    }
    Ok(())
}
