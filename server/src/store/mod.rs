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

mod connection;
mod invoke;
mod silence;
pub mod time;
mod topology;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelClient;
use sluice_core::key::{CLUSTER_SLOTS, cluster_slot};
use tokio::sync::{Mutex, RwLock};

use crate::busy_poll::Activity;
use crate::clock;
use crate::log_throttle::LogThrottle;
use crate::scripts::{BadReply, SCRIPTS};
use silence::SilenceWatch;
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
    /// Whether a connection was ever up: calls may go from the first.
    connected: tokio::sync::watch::Sender<bool>,
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
            silence: SilenceWatch::new(lanes, Store::silent_after(timeout), clock::monotonic()),
            left_replica_at: std::sync::Mutex::new(None),
            activity: Arc::default(),
            connected: tokio::sync::watch::Sender::new(false),
        });
        let background = Arc::clone(&store);
        tokio::spawn(async move { background.keep_connecting().await });
        store
    }

    /// Waits until the first connection is up (at once if it was).
    pub async fn wait_connected(&self) {
        let mut connected = self.connected.subscribe();
        // The sender lives as long as `self`, so the wait ends only when connected.
        let _ = connected.wait_for(|up| *up).await;
    }

    /// How long calls may go without an answer before the server takes their connection for
    /// dead and opens another: ten timeouts, and at least 3 s. To one Redis, that is any call
    /// (Redis' clock is read every second, so even an idle server's connection answers about
    /// that often); on a Cluster, the calls of a run of slots, which one primary serves.
    pub fn silent_after(timeout: Duration) -> Duration {
        (timeout * 10).max(SILENT_AT_LEAST)
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
        *left_at = Some(clock::monotonic());
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
        let now = clock::monotonic();
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
            store.silence.replaced(clock::monotonic());
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

/// `FUNCTION LOAD REPLACE` of sluice's library (on a Cluster, on every primary).
async fn load_library(backend: Backend) -> redis::RedisResult<()> {
    query::<redis::Value>(backend, &SCRIPTS.library().load_command())
        .await
        .map(drop)
}
