//! Readiness, one answer for `/readyz` and gRPC health checking: each asks Redis then and there
//! ([`crate::engine::Engine::ready`]), so the two never disagree. gRPC `Watch`ers hear each
//! change, looked for every few seconds and at every `Check`.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService, WatchStream};

use crate::app_state::AppState;
use crate::envoy_api::{quota, ratelimit};

/// gRPC health checking's own service name.
pub(crate) const HEALTH_SERVICE: &str = "grpc.health.v1.Health";

/// Health checking: the server as a whole (`""`) is serving while a decision succeeds; the rate
/// limit and quota services too, each when it has a configuration.
pub struct ReadyHealth {
    statuses: HealthService,
    reporter: HealthReporter,
    state: Weak<AppState>,
}

impl ReadyHealth {
    /// Asks Redis now, and reports what it said to checkers and watchers alike.
    async fn refresh(&self) {
        let Some(state) = self.state.upgrade() else {
            return;
        };
        let status = match state.engine.ready().await {
            Ok(()) => ServingStatus::Serving,
            Err(_) => ServingStatus::NotServing,
        };
        report(&self.reporter, &state, status).await;
    }
}

#[tonic::async_trait]
impl Health for ReadyHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.refresh().await;
        self.statuses.check(request).await
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        self.statuses.watch(request).await
    }
}

/// The health service, and a task refreshing it every `every` for its watchers.
pub fn health_service(
    state: &Arc<AppState>,
    every: Duration,
) -> (HealthServer<ReadyHealth>, tokio::task::JoinHandle<()>) {
    let reporter = HealthReporter::new();
    let health = Arc::new(ReadyHealth {
        statuses: HealthService::from_health_reporter(reporter.clone()),
        reporter,
        state: Arc::downgrade(state),
    });
    let refreshed = Arc::clone(&health);
    let task = tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if refreshed.state.strong_count() == 0 {
                return;
            }
            refreshed.refresh().await;
        }
    });
    (HealthServer::from_arc(health), task)
}

async fn report(reporter: &HealthReporter, state: &AppState, status: ServingStatus) {
    reporter.set_service_status("", status).await;
    let served = |configured: bool| {
        if configured {
            status
        } else {
            ServingStatus::NotServing
        }
    };
    reporter
        .set_service_status(ratelimit::SERVICE, served(state.rls.is_some()))
        .await;
    reporter
        .set_service_status(quota::SERVICE, served(state.rlqs.is_some()))
        .await;
}
