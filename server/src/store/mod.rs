//! The connection to Redis: standalone, Cluster or Sentinel, reconnecting by itself, with a
//! timeout on every call.
//!
//! The server starts whether or not Redis is up: until a first connection succeeds, calls fail
//! at once with [`StoreError::NotConnected`] (503) while a background task keeps trying. After
//! that, the `redis` crate's managers reconnect by themselves; a call made while Redis is away
//! fails within the timeout, and calls succeed again as soon as it is back. Behind Sentinel, a
//! failed call also asks the sentinels where the primary is now, so a failover is followed; to
//! one server, a `READONLY` answer (a failover behind its name) makes the store connect afresh.
//! A connection whose calls have had no answer for a while is replaced, a Cluster's too
//! (`silence.rs`). One server that is a Cluster's node or a replica is not taken.
//! Scripts are called as functions of sluice's library ([`crate::scripts::Library`]) by
//! `FCALL`, the library loaded on connecting and again whenever Redis answers that a function
//! is missing (after `FUNCTION FLUSH`, a restart without persistence, or on a Cluster node
//! added later). Where Redis has no Functions (before 7.0), or its ACL refuses them, or
//! [`ScriptCalls::Eval`] says so, scripts are sent by `EVALSHA` and loaded again on `NOSCRIPT`:
//! `redis::Script` knows that dance, and only it.

mod silence;
mod time;
mod topology;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::IntoConnectionInfo;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelClient;
use sluice_core::key::{CLUSTER_SLOTS, cluster_slot};
use sluice_core::verdict::Verdict;
use sluice_core::wire::LeaseGrant;
use tokio::sync::{Mutex, RwLock};

use crate::busy_poll::Activity;
use crate::log_throttle::LogThrottle;
use crate::scripts::{
    BadReply, BatchCall, LeaseCall, LimitScript, SCRIPTS, ScriptCall, decode_reply,
};
use silence::SilenceWatch;
pub use time::{read_time_us, time_us_of};
use topology::sentinel_client;
pub use topology::{Credentials, Topology, redacted, tcp_settings};

/// How the scripts are called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ScriptCalls {
    /// By `FCALL`, as functions of sluice's library, where Redis has Functions (7.0 and later)
    /// and lets the server load it; by `EVALSHA` elsewhere. A script's definitions then run
    /// once when the library loads, not on every call.
    #[default]
    Functions,
    /// By `EVALSHA` only: nothing is loaded into Redis but its script cache.
    Eval,
}

/// A failed Redis call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    /// The one server given is a node of a Cluster (its URL, password hidden).
    #[error(
        "redis: `{0}` is a node of a Redis Cluster, which keeps each key on one of its nodes: \
         give it as a Cluster (--redis-cluster)"
    )]
    ClusterNode(String),
    /// The one server given is a replica (its URL, password hidden, and its primary).
    #[error(
        "redis: `{url}` is a replica of {primary}, which refuses writes: give the primary, or \
         the sentinels that follow it (--redis-sentinel)"
    )]
    Replica {
        /// The URL given.
        url: String,
        /// `host:port` of its primary, as it reports it.
        primary: String,
    },
}

impl StoreError {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::NotConnected(_) => "not_connected",
            StoreError::Timeout(_) => "timeout",
            StoreError::Redis(_) => "error",
            StoreError::BadReply(_) => "bad_reply",
            StoreError::ClusterNode(_) => "cluster_node",
            StoreError::Replica { .. } => "replica",
        }
    }
}

#[derive(Clone)]
enum Backend {
    /// A standalone server, or the primary Sentinel named.
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Tries of a Cluster call after its first: a redirect and a pause or two fit in its time.
const CLUSTER_RETRIES: u32 = 4;

/// How often, at most, a failed load of the functions library is logged.
const LOAD_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// The least time a connection must go without answering anything before it is taken for
/// dead (see [`Store::silent_after`]).
const SILENT_AT_LEAST: Duration = Duration::from_secs(3);

/// The slots a lane of a Cluster's silence watch covers (see `silence.rs`): a run short enough
/// that each primary serves whole lanes, and few lanes to watch.
const SLOTS_PER_LANE: u16 = 16;

/// How often, at most, the sentinels are asked where the primary is.
const SENTINEL_REFRESH_INTERVAL: Duration = Duration::from_millis(200);

struct SentinelState {
    client: Mutex<SentinelClient>,
    /// The primary's address the current connection goes to.
    primary: Mutex<String>,
    refreshing: AtomicBool,
    last_refresh: Mutex<Option<Instant>>,
}

/// The shared Redis handle.
pub struct Store {
    topology: Topology,
    credentials: Credentials,
    timeout: Duration,
    /// Set once `FCALL` is known not to work here: [`ScriptCalls::Eval`], no Functions, or an
    /// ACL that refuses them.
    eval_only: AtomicBool,
    /// A failed load of the library, logged once in a while.
    load_warning: LogThrottle,
    backend: RwLock<Option<Backend>>,
    last_error: RwLock<String>,
    sentinel: Option<SentinelState>,
    /// Whether calls have gone unanswered long enough to take their connection for dead.
    silence: SilenceWatch,
    /// When the connection to one server that became a replica was last dropped.
    left_replica_at: std::sync::Mutex<Option<Instant>>,
    /// Calls starting and ending, for the busy poller.
    activity: Arc<Activity>,
}

impl Store {
    /// A store for `topology`, calling scripts as functions where Redis has them; connects in
    /// the background, retrying until it succeeds.
    pub fn connect(topology: Topology, timeout: Duration) -> Arc<Store> {
        Store::connect_calling(
            topology,
            timeout,
            ScriptCalls::default(),
            Credentials::default(),
        )
    }

    /// As [`Store::connect`], calling scripts as `calls` says, and logging in with
    /// `credentials`.
    pub fn connect_calling(
        topology: Topology,
        timeout: Duration,
        calls: ScriptCalls,
        credentials: Credentials,
    ) -> Arc<Store> {
        // ring is the one provider built in; installed before any TLS handshake asks for one.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let sentinel = match &topology {
            Topology::Sentinel { sentinels, master } => {
                match sentinel_client(sentinels, master, &credentials) {
                    Ok(client) => Some(SentinelState {
                        client: Mutex::new(client),
                        primary: Mutex::new(String::new()),
                        refreshing: AtomicBool::new(false),
                        last_refresh: Mutex::new(None),
                    }),
                    Err(e) => {
                        tracing::error!(error = %e, "bad sentinel configuration");
                        None
                    }
                }
            }
            _ => None,
        };
        let lanes = match topology {
            Topology::Cluster(_) => usize::from(CLUSTER_SLOTS / SLOTS_PER_LANE),
            _ => 1,
        };
        let store = Arc::new(Store {
            topology,
            credentials,
            timeout,
            eval_only: AtomicBool::new(calls == ScriptCalls::Eval),
            load_warning: LogThrottle::new(LOAD_WARNING_INTERVAL),
            backend: RwLock::new(None),
            last_error: RwLock::new("connecting".to_owned()),
            sentinel,
            silence: SilenceWatch::new(lanes, Store::silent_after(timeout), Instant::now()),
            left_replica_at: std::sync::Mutex::new(None),
            activity: Arc::default(),
        });
        let background = Arc::clone(&store);
        tokio::spawn(async move { background.keep_connecting().await });
        store
    }

    async fn keep_connecting(&self) {
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
                    tracing::info!(topology = ?self.topology, "connected to redis");
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

    /// How long calls may go without an answer before the server takes their connection for
    /// dead and opens another: ten timeouts, and at least 3 s. To one Redis, that is any call
    /// (Redis' clock is read every second, so even an idle server's connection answers about
    /// that often); on a Cluster, the calls of a run of slots, which one primary serves.
    pub fn silent_after(timeout: Duration) -> Duration {
        (timeout * 10).max(SILENT_AT_LEAST)
    }

    /// How long opening a backend may take, with what it asks on the way (the sentinels, a
    /// Cluster's slots): the call's timeout, but not under 1 s.
    fn open_timeout(&self) -> Duration {
        self.timeout.max(Duration::from_secs(1))
    }

    /// How long opening a connection may take: the call's timeout, but not under 250 ms.
    fn connect_timeout(&self) -> Duration {
        self.timeout.max(Duration::from_millis(250))
    }

    /// The pause before the Redis client tries again, to reconnect or after a Cluster node
    /// refused a call for the moment (`TRYAGAIN` mid-reshard, `CLUSTERDOWN` until a replica
    /// takes over): a twentieth of a call's timeout, so that another try fits in it. The
    /// client's own pauses, 100 ms before reconnecting and 1.28 s on a Cluster, were as long
    /// as the default timeout or longer: calls waited it out instead of failing on a refused
    /// connection (a filter failing open then held its request that long) or succeeding on a
    /// second try.
    fn retry_pause(&self) -> Duration {
        self.timeout / 20
    }

    fn manager_config(&self) -> ConnectionManagerConfig {
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

    async fn open(&self) -> Result<Backend, StoreError> {
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
    fn follow_failover(self: &Arc<Self>) {
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
            *last = Some(Instant::now());
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

    async fn backend(&self) -> Result<Backend, StoreError> {
        match self.backend.read().await.as_ref() {
            Some(b) => Ok(b.clone()),
            None => Err(StoreError::NotConnected(
                self.last_error.read().await.clone(),
            )),
        }
    }

    /// Every call starting and ending (see [`crate::busy_poll`]).
    pub fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }

    /// Whether every key of a request may go to one script call: true but on a Cluster, where
    /// a request's keys live on different nodes.
    pub fn runs_batches(&self) -> bool {
        !matches!(self.topology, Topology::Cluster(_))
    }

    /// Runs one script call, loading the script if Redis does not have it.
    pub async fn run(self: &Arc<Self>, call: &ScriptCall) -> Result<Verdict, StoreError> {
        let reply = self
            .invoke(call.script(), std::slice::from_ref(&call.key), &call.args())
            .await?;
        Ok(decode_reply(&reply)?)
    }

    /// Runs lease asks in one call of the lease script.
    pub async fn run_lease(
        self: &Arc<Self>,
        call: &LeaseCall,
    ) -> Result<Vec<LeaseGrant>, StoreError> {
        let reply = self.invoke(call.script(), &call.keys, &call.args).await?;
        Ok(call.decode(&reply)?)
    }

    /// Runs several checks in one call of the batch script.
    pub async fn run_batch(self: &Arc<Self>, call: &BatchCall) -> Result<Vec<Verdict>, StoreError> {
        let reply = self.invoke(call.script(), &call.keys, &call.args).await?;
        Ok(call.decode(&reply)?)
    }

    /// `FCALL`, and on a missing function `FUNCTION LOAD` and again; or `EVALSHA`, and on
    /// `NOSCRIPT` `SCRIPT LOAD` and again (redis::Script knows that dance).
    async fn invoke(
        self: &Arc<Self>,
        script: &LimitScript,
        keys: &[String],
        args: &[impl redis::ToRedisArgs + Sync],
    ) -> Result<redis::Value, StoreError> {
        let backend = self.backend().await?;
        let key = keys.first().map(String::as_bytes);
        self.within_timeout(key, async {
            if !self.eval_only.load(Ordering::Relaxed) {
                let fcall = script.fcall(keys, args);
                match query(backend.clone(), &fcall).await {
                    Err(e) if is_function_missing(&e) => {
                        match load_library(backend.clone()).await {
                            Ok(()) => return query(backend, &fcall).await,
                            Err(e) => self.functions_failed(&e),
                        }
                    }
                    Err(e) if refuses_functions(&e) => self.functions_failed(&e),
                    answered => return answered,
                }
            }
            let invocation = script.evalsha(keys, args);
            match backend {
                Backend::Single(mut c) => invocation.invoke_async(&mut c).await,
                Backend::Cluster(mut c) => invocation.invoke_async(&mut c).await,
            }
        })
        .await
    }

    /// After `FUNCTION LOAD` or `FCALL` failed with `error`: for good, by `EVALSHA` from now on,
    /// if Redis has no Functions or refuses them; else this call alone.
    fn functions_failed(&self, error: &redis::RedisError) {
        if refuses_functions(error) {
            if !self.eval_only.swap(true, Ordering::Relaxed) {
                tracing::warn!(%error, "Redis will not run sluice's functions library; scripts are called by EVALSHA");
            }
        } else {
            // Every call that misses the library meets this while it lasts (a Cluster primary
            // down, say): say so once in a while, not once a call.
            if let Some(left_out) = self.load_warning.due(Instant::now()) {
                tracing::warn!(%error, left_out, "loading the functions library failed; calls that miss it go by EVALSHA until it loads");
            }
        }
    }

    /// Whether scripts are called as functions (until Redis shows it will not run them).
    pub fn calls_functions(&self) -> bool {
        !self.eval_only.load(Ordering::Relaxed)
    }

    /// `call` bounded by the timeout; `key`, the call's first key if it has one, tells the
    /// silence watch which lane it is in.
    async fn within_timeout<T>(
        self: &Arc<Self>,
        key: Option<&[u8]>,
        call: impl Future<Output = Result<T, redis::RedisError>>,
    ) -> Result<T, StoreError> {
        self.activity.happened();
        let result = tokio::time::timeout(self.timeout, call).await;
        self.activity.happened();
        let result = match result {
            // The connection's own response timeout is the same timeout, said by the driver.
            Ok(Err(e)) if e.is_timeout() => Err(StoreError::Timeout(self.timeout)),
            Ok(result) => result.map_err(StoreError::from),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        };
        let timed_out = matches!(result, Err(StoreError::Timeout(_)));
        if (timed_out || self.silence.watching())
            && let Some(lane) = self.lane(key)
        {
            if timed_out {
                self.replace_if_silent(lane);
            } else {
                self.silence.answered(lane);
            }
        }
        if let Err(StoreError::Redis(e)) = &result
            && e.code() == Some("READONLY")
        {
            self.leave_replica(e);
        }
        if result.is_err() {
            self.follow_failover();
        }
        result
    }

    /// After one server given refused a write as a replica: it was demoted (a failover behind
    /// a DNS name, a `REPLICAOF`), and the connection, which outlives that, would meet every
    /// call with `READONLY` for as long as it stood. Drops it and connects afresh, as at
    /// start-up: the name is resolved again, and a replica refused until a primary answers.
    /// Behind Sentinel, [`Store::follow_failover`] asks the sentinels instead.
    fn leave_replica(self: &Arc<Self>, error: &redis::RedisError) {
        if !matches!(self.topology, Topology::Standalone(_)) {
            return;
        }
        // Calls sent on the connection dropped are answered within the timeout: their
        // `READONLY` says nothing of the connection that replaces it. (Until that one is
        // made, calls fail without reaching Redis.)
        let mut left_at = self
            .left_replica_at
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if left_at.is_some_and(|at| at.elapsed() < self.timeout) {
            return;
        }
        *left_at = Some(Instant::now());
        drop(left_at);
        tracing::warn!(%error, "redis refused a write as a replica; connecting afresh");
        let store = Arc::clone(self);
        let error = error.to_string();
        tokio::spawn(async move {
            *store.last_error.write().await = error;
            *store.backend.write().await = None;
            store.keep_connecting().await;
        });
    }

    /// The silence watch's lane of a call with first key `key`: the only one with one Redis;
    /// on a Cluster, by the key's slot (a call without a key is not watched there).
    fn lane(&self, key: Option<&[u8]>) -> Option<usize> {
        match self.topology {
            Topology::Cluster(_) => Some(usize::from(cluster_slot(key?) / SLOTS_PER_LANE)),
            _ => Some(0),
        }
    }

    /// After a call in `lane` that had no answer: when the lane has had none for
    /// [`Store::silent_after`], opens a new connection in the background (see `silence.rs`);
    /// on a Cluster, a new client, which reads where the slots are afresh.
    fn replace_if_silent(self: &Arc<Self>, lane: usize) {
        let now = Instant::now();
        // When the call was sent; `Instant - Duration` would panic before the clock's origin.
        let sent = now.checked_sub(self.timeout).unwrap_or(now);
        let Some(silent) = self.silence.unanswered(lane, sent, now) else {
            return;
        };
        let store = Arc::clone(self);
        tokio::spawn(async move {
            let opened = tokio::time::timeout(store.open_timeout(), store.open()).await;
            match opened {
                Ok(Ok(backend)) => {
                    tracing::warn!(?silent, topology = ?store.topology, "redis answered nothing on its connection; opened a new one");
                    *store.backend.write().await = Some(backend);
                }
                Ok(Err(e)) => {
                    tracing::warn!(?silent, error = %e, "redis answered nothing on its connection, and a new one did not open")
                }
                Err(_) => tracing::warn!(
                    ?silent,
                    "redis answered nothing on its connection, and a new one did not open in time"
                ),
            }
            store.silence.replaced(Instant::now());
        });
    }
}

/// One command on whichever connection the backend has.
async fn query<T: redis::FromRedisValue>(
    backend: Backend,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    match backend {
        Backend::Single(mut c) => cmd.query_async(&mut c).await,
        Backend::Cluster(mut c) => cmd.query_async(&mut c).await,
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

/// `FUNCTION LOAD REPLACE` of sluice's library (on a Cluster, on every primary).
async fn load_library(backend: Backend) -> redis::RedisResult<()> {
    query::<redis::Value>(backend, &SCRIPTS.library().load_command())
        .await
        .map(drop)
}

/// Redis' answer to `FCALL` of a function it does not have.
fn is_function_missing(error: &redis::RedisError) -> bool {
    error.code() == Some("ERR") && error.detail() == Some("Function not found")
}

/// Redis without Functions (before 7.0: `FUNCTION` and `FCALL` are unknown commands), or an ACL
/// that forbids them.
fn refuses_functions(error: &redis::RedisError) -> bool {
    error.code() == Some("NOPERM")
        || (error.code() == Some("ERR")
            && error
                .detail()
                .is_some_and(|d| d.starts_with("unknown command")))
}
