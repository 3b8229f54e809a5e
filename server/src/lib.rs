//! sluice-server: the stateless limit service behind the sluice filter.
//!
//! Every Envoy's filter sends one `POST /v1/decide` per request ([`sluice_core::wire`]); the
//! server runs the checks' scripts from `lua/` atomically in Redis ([`scripts`], [`store`]) and
//! answers. Any number of replicas can serve the same Redis: they hold no state, and time comes
//! from Redis' clock.
//!
//! - [`config`]: flags and `SLUICE_*` environment variables.
//! - [`store`]: Redis standalone, Cluster or Sentinel; reconnection; timeouts.
//! - [`clock`]: Redis' clock, read once a second and carried between reads.
//! - [`busy_poll`]: polling instead of sleeping while Redis calls come and go.
//! - [`engine`]: the decision procedure.
//! - [`http`]: `/v1/decide`, `/healthz`, `/readyz`, `/metrics`.
//! - [`health`]: readiness, for `/readyz` and gRPC health checking alike.
//! - [`rls`]: Envoy's gRPC rate limit service API, with the reference service's configuration,
//!   served beside `/v1/` when a configuration is given.
//! - [`envoy_api`]: the messages of Envoy's rate limit and quota services, and their clients.
//!
//! [`spawn`] runs a server in-process on a TCP port, [`in_process`](fn@in_process) one reached by calling it
//! (the simulator does); the `sluice-server` binary is a thin shell over [`serve`].

#![deny(missing_docs)]

mod answer_body;
pub mod app_state;
pub mod busy_poll;
pub mod clock;
pub mod config;
pub mod config_files;
pub mod engine;
pub mod envoy_api;
pub mod flag_error;
mod grpc;
pub mod health;
pub mod http;
pub mod in_process;
pub mod inbound;
pub mod label_budget;
pub mod log_throttle;
pub mod metrics;
mod reload;
pub mod rlqs;
pub mod rls;
pub mod scripts;
pub mod store;
pub mod tls;

mod pem;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::ServiceExt;
use log_throttle::FailureWarnings;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

pub use config::ServerConfig;

use crate::app_state::AppState;
use crate::engine::Engine;
use crate::grpc::grpc_router;
use crate::http::{Service, Shortcuts, router};
use crate::metrics::Metrics;
use crate::reload::{watch_rlqs_config, watch_rls_config};
use crate::store::Store;
use crate::tls::TlsFor;
use crate::tls::listener::{ConnectionLimits, Listening};

/// A listener on `addr` whose kernel queue holds `backlog` connections not yet taken (capped
/// by the kernel's net.core.somaxconn); must be called within a Tokio runtime.
pub fn bind(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    bind_socket(addr, backlog, false)
}

/// `count` listening sockets on `addr` (port 0: one the first picks), one for each thread:
/// the kernel spreads connections over them (`SO_REUSEPORT`), so no thread wakes for
/// another's. Made in the calling runtime and handed back free of it, for each thread's own.
pub fn bind_each(
    addr: SocketAddr,
    count: usize,
    backlog: u32,
) -> std::io::Result<Vec<std::net::TcpListener>> {
    let mut listeners = Vec::with_capacity(count);
    let mut addr = addr;
    for _ in 0..count.max(1) {
        let listener = bind_socket(addr, backlog, count > 1)?;
        addr = listener.local_addr()?;
        listeners.push(listener.into_std()?);
    }
    Ok(listeners)
}

fn bind_socket(addr: SocketAddr, backlog: u32, shared: bool) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    // As std's and tokio's own bind: a restarted server takes its port at once.
    socket.set_reuseaddr(true)?;
    if shared {
        socket.set_reuseport(true)?;
    }
    socket.bind(addr)?;
    socket.listen(backlog.max(1))
}

/// Serves on `listener` until `shutdown` completes, then lets requests in flight finish for up
/// to the configured grace period. The gRPC API is served on the same port.
pub async fn serve(
    config: ServerConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_on(config, listener, None, shutdown).await
}

/// As [`serve`], with the gRPC API on `grpc_listener` alone when one is given.
pub async fn serve_on(
    config: ServerConfig,
    listener: TcpListener,
    grpc_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_thread(
        config,
        ServerThread::alone(),
        listener,
        grpc_listener,
        shutdown,
    )
    .await
}

/// One of the server's threads: each serves on its own event loop, with its own listening
/// sockets and Redis connection, and they share the metrics and the log's throttles.
#[derive(Clone)]
pub struct ServerThread {
    /// The metrics every thread counts into.
    pub metrics: Arc<Metrics>,
    /// The throttles of the warnings of failed requests: once a second for the process.
    pub failure_warnings: Arc<FailureWarnings>,
    /// Whether this thread keeps the process-wide background work (reloading the rate limit
    /// configuration and the TLS certificates): one thread does.
    pub primary: bool,
    /// The threads whose Redis connection is up, of how many: the process says it is
    /// connected once every thread can decide.
    pub connected: Arc<ThreadsConnected>,
}

/// How many of a server's threads have their Redis connection up.
#[derive(Debug)]
pub struct ThreadsConnected {
    up: std::sync::atomic::AtomicUsize,
    of: usize,
}

impl ThreadsConnected {
    /// None of `threads` yet.
    pub fn of(threads: usize) -> Arc<ThreadsConnected> {
        Arc::new(ThreadsConnected {
            up: std::sync::atomic::AtomicUsize::new(0),
            of: threads,
        })
    }

    /// Counts one more thread connected; true for the last.
    fn one_more(&self) -> bool {
        self.up.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1 == self.of
    }
}

impl ServerThread {
    /// The one thread of a server that has one.
    pub fn alone() -> ServerThread {
        ServerThread::first_of(1)
    }

    /// The first (primary) of `threads` threads; the others are its clones with `primary`
    /// false.
    pub fn first_of(threads: usize) -> ServerThread {
        ServerThread {
            metrics: Arc::new(Metrics::default()),
            failure_warnings: Arc::default(),
            primary: true,
            connected: ThreadsConnected::of(threads),
        }
    }
}

/// As [`serve_on`], as one of several threads of the server (see [`ServerThread`]).
pub async fn serve_thread(
    config: ServerConfig,
    thread: ServerThread,
    listener: TcpListener,
    grpc_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let tls_on_grpc_alone = config
        .tls
        .as_ref()
        .is_some_and(|tls| tls.on == TlsFor::Grpc);
    if tls_on_grpc_alone && grpc_listener.is_none() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "TLS for the gRPC listener alone, and no gRPC listener",
        ));
    }
    // Every server stops taking connections at once when `shutdown` completes.
    let (stopping_tx, stopping_rx) = watch::channel(false);
    let state = app_state(&config, &thread, stopping_rx.clone());
    let mut background = background_tasks(&config, &thread, &state);
    // Without a configuration the rate limit service still answers, to say how to get one.
    let (grpc, health_task) = grpc_router(&state);
    background.push(health_task);
    let services = Services::new(&state, grpc, listener, grpc_listener);
    let servers = services.serve(&config, &state, stopping_rx);
    let result = tokio::select! {
        result = servers => result,
        () = stop_after_grace(shutdown, stopping_tx, config.shutdown_grace) => {
            tracing::warn!(
                grace = ?config.shutdown_grace,
                "requests still in flight after the grace period; stopping anyway"
            );
            Ok(())
        }
    };
    for task in background {
        task.abort();
    }
    result
}

/// What a thread serves: the HTTP API on its listener, with the gRPC APIs there too unless
/// they have a listener of their own.
struct Services {
    http: (TcpListener, Service),
    grpc: Option<(TcpListener, Service)>,
}

impl Services {
    fn new(
        state: &Arc<AppState>,
        grpc: axum::Router,
        listener: TcpListener,
        grpc_listener: Option<TcpListener>,
    ) -> Services {
        let app = router(Arc::clone(state));
        let grpc_on_http = grpc_listener.is_none();
        let (app, grpc) = match grpc_listener {
            Some(grpc_listener) => {
                let shortcuts = Shortcuts {
                    decide: false,
                    should_rate_limit: true,
                };
                let grpc = Service::new(Arc::clone(state), grpc, shortcuts);
                (app, Some((grpc_listener, grpc)))
            }
            None => (app.merge(grpc), None),
        };
        let shortcuts = Shortcuts {
            decide: true,
            should_rate_limit: grpc_on_http,
        };
        Services {
            http: (listener, Service::new(Arc::clone(state), app, shortcuts)),
            grpc,
        }
    }

    /// Serves until `stopping` turns true, then lets the connections' requests finish.
    async fn serve(
        self,
        config: &ServerConfig,
        state: &Arc<AppState>,
        stopping: watch::Receiver<bool>,
    ) -> std::io::Result<()> {
        let stopped = move || {
            let mut stopping = stopping.clone();
            async move {
                let _ = stopping.wait_for(|s| *s).await;
            }
        };
        let limits = ConnectionLimits::new(
            config.max_connections,
            config.idle_timeout,
            config.request_timeout,
        );
        let (listener, app) = self.http;
        let http_tls = config.tls.as_ref().filter(|tls| tls.on == TlsFor::All);
        let app = ServiceExt::<axum::extract::Request>::into_make_service(app);
        let http = axum::serve(
            Listening::new(listener, http_tls, &state.metrics, &limits),
            app,
        )
        .with_graceful_shutdown(stopped());
        match self.grpc {
            Some((grpc_listener, grpc)) => {
                let grpc_listener =
                    Listening::new(grpc_listener, config.tls.as_ref(), &state.metrics, &limits);
                let grpc = ServiceExt::<axum::extract::Request>::into_make_service(grpc);
                let grpc = axum::serve(grpc_listener, grpc).with_graceful_shutdown(stopped());
                tokio::try_join!(http.into_future(), grpc.into_future()).map(drop)
            }
            None => http.await,
        }
    }
}

/// Waits for `shutdown`, tells every server to stop taking connections, and gives the
/// requests in flight `grace` to finish.
async fn stop_after_grace(
    shutdown: impl Future<Output = ()>,
    stopping: watch::Sender<bool>,
    grace: Duration,
) {
    shutdown.await;
    tracing::info!("shutting down: finishing requests in flight");
    let _ = stopping.send(true);
    tokio::time::sleep(grace).await;
}

/// What a thread runs beside its servers: the primary thread watches the configurations' and
/// certificates' files, and every thread busy-polls when asked to.
fn background_tasks(
    config: &ServerConfig,
    thread: &ServerThread,
    state: &Arc<AppState>,
) -> Vec<JoinHandle<()>> {
    let mut background = Vec::new();
    if let Some(rls) = state.rls.as_ref().filter(|_| thread.primary) {
        background.push(watch_rls_config(rls, &state.metrics));
    }
    if let Some(rlqs) = state.rlqs.as_ref().filter(|_| thread.primary) {
        background.push(watch_rlqs_config(rlqs));
    }
    if let Some(tls) = config.tls.as_ref().filter(|_| thread.primary) {
        background.push(tls.keep_reloading());
    }
    if let Some(budget) = config.busy_poll {
        let activity = Arc::clone(state.engine.store().activity());
        let metrics = Arc::clone(&state.metrics);
        background.push(tokio::spawn(busy_poll::busy_poll(
            activity,
            budget,
            move |spent| metrics.busy_polled(spent),
        )));
    }
    background
}

/// The state every handler shares: the engine over a Redis connection, metrics, settings.
/// `stopping` turns true when the server begins to shut down.
fn app_state(
    config: &ServerConfig,
    thread: &ServerThread,
    stopping: watch::Receiver<bool>,
) -> Arc<AppState> {
    let metrics = Arc::clone(&thread.metrics);
    let store = Store::connect_calling(
        config.topology.clone(),
        config.redis_timeout,
        config.script_calls,
        config.redis_credentials.clone(),
    );
    let (connected, this_store, topology) = (
        Arc::clone(&thread.connected),
        Arc::clone(&store),
        config.topology.clone(),
    );
    tokio::spawn(async move {
        this_store.wait_connected().await;
        // Said when every thread can decide: a caller that waits for it is answered
        // whichever thread its connection lands on.
        if connected.one_more() {
            tracing::info!(?topology, "connected to redis");
        }
    });
    Arc::new(AppState {
        engine: Engine::new(store, config.key_prefix.clone(), Arc::clone(&metrics)),
        metrics,
        token: config.token.clone(),
        metrics_need_token: config.metrics_need_token,
        replay_time: config.replay_time,
        rls: config.rls.clone(),
        rlqs: config.rlqs.clone(),
        failure_warnings: Arc::clone(&thread.failure_warnings),
        stopping,
    })
}

/// A server running in this process.
pub struct RunningServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

/// Starts a server on `listen` (port 0 picks a free one) in this process.
pub async fn spawn(config: ServerConfig, listen: SocketAddr) -> std::io::Result<RunningServer> {
    let listener = TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(config, listener, async move {
        let _ = stopped.await;
    }));
    Ok(RunningServer {
        addr,
        stop: Some(stop),
        task,
    })
}

/// A server in this process that is reached by calling it (see [`in_process`](mod@in_process)); it must be
/// created within a Tokio runtime, and lives as long as any clone of it.
pub fn in_process(config: ServerConfig) -> in_process::InProcessServer {
    // Never shut down: it lives as long as its callers.
    let (_, never) = watch::channel(false);
    let state = app_state(&config, &ServerThread::alone(), never);
    // `ShouldRateLimit` as the simulator's model of Envoy's native filter sends it; the rest of
    // the gRPC API (other calls, health) has no caller in this process.
    let shortcuts = Shortcuts {
        decide: true,
        should_rate_limit: config.rls.is_some(),
    };
    in_process::InProcessServer::new(
        Service::new(Arc::clone(&state), router(Arc::clone(&state)), shortcuts),
        state,
    )
}

impl RunningServer {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its base URL: `http://ip:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Shuts it down gracefully and waits for it.
    pub async fn stop(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(result) => result,
            Err(e) => Err(std::io::Error::other(e)),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
