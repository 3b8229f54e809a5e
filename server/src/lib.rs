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
//! - [`engine`]: the decision procedure.
//! - [`http`]: `/v1/decide`, `/healthz`, `/readyz`, `/metrics`.
//! - [`rls_config`]: the reference rate limit service's YAML files, for Envoy's gRPC API (not yet
//!   served).
//!
//! [`spawn`] runs a server in-process on a TCP port, [`in_process`] one reached by calling it
//! (the simulator does); the `sluice-server` binary is a thin shell over [`serve`].

#![deny(missing_docs)]

pub mod clock;
pub mod config;
pub mod engine;
pub mod http;
pub mod memory;
pub mod metrics;
pub mod rls_config;
pub mod scripts;
pub mod store;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use config::ServerConfig;

use crate::engine::Engine;
use crate::http::{AppState, router};
use crate::metrics::Metrics;
use crate::store::Store;

/// Serves on `listener` until `shutdown` completes, then lets requests in flight finish for up
/// to the configured grace period.
pub async fn serve(
    config: ServerConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Answers are small and latency is the product: no Nagle delay on accepted connections.
    let listener = listener.tap_io(|stream| {
        let _ = stream.set_nodelay(true);
    });
    let state = app_state(&config);
    let (stopping_tx, stopping_rx) = oneshot::channel::<()>();
    let server = axum::serve(listener, router(state)).with_graceful_shutdown(async move {
        shutdown.await;
        tracing::info!("shutting down: finishing requests in flight");
        let _ = stopping_tx.send(());
    });
    let grace = config.shutdown_grace;
    tokio::select! {
        result = server.into_future() => result,
        () = async {
            // Only counts once shutdown has begun.
            if stopping_rx.await.is_ok() {
                tokio::time::sleep(grace).await;
            } else {
                std::future::pending::<()>().await;
            }
        } => {
            tracing::warn!(?grace, "requests still in flight after the grace period; stopping anyway");
            Ok(())
        }
    }
}

/// The state every handler shares: the engine over a Redis connection, metrics, settings.
fn app_state(config: &ServerConfig) -> Arc<AppState> {
    let metrics = Arc::new(Metrics::default());
    let store = Store::connect(config.topology.clone(), config.redis_timeout);
    Arc::new(AppState {
        engine: Engine::new(store, config.key_prefix.clone(), Arc::clone(&metrics)),
        metrics,
        token: config.token.clone(),
        replay_time: config.replay_time,
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

/// A server in this process that is reached by calling it (see [`memory`]); it must be
/// created within a Tokio runtime, and lives as long as any clone of it.
pub fn in_process(config: ServerConfig) -> memory::InProcessServer {
    memory::InProcessServer::new(router(app_state(&config)))
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
