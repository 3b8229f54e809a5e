//! The gRPC API on its routes: the rate limit service, the quota service and gRPC health
//! checking.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::app_state::AppState;
use crate::envoy_api::{quota, ratelimit};
use crate::health::{self, HEALTH_SERVICE};
use crate::{rlqs, rls};

/// How often the health status is taken anew.
const HEALTH_CHECK_EVERY: Duration = Duration::from_secs(2);

/// The rate limit and quota services and gRPC health checking, as routes, and the task that
/// keeps the health status.
pub(crate) fn grpc_router(state: &Arc<AppState>) -> (axum::Router, JoinHandle<()>) {
    let (health, health_task) = health::health_service(state, HEALTH_CHECK_EVERY);
    let rate_limit = rls::service::rate_limit_service(Arc::clone(state));
    let quota = rlqs::service::rate_limit_quota_service(Arc::clone(state));
    let route = |name: &str| format!("/{name}/{{*method}}");
    let router = axum::Router::new()
        .route_service(&route(ratelimit::SERVICE), rate_limit)
        .route_service(&route(quota::SERVICE), quota)
        .route_service(&route(HEALTH_SERVICE), health);
    (router, health_task)
}
