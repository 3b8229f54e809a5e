//! What every handler shares, over HTTP and gRPC alike.

use std::sync::Arc;

use crate::engine::Engine;
use crate::log_throttle::FailureWarnings;
use crate::metrics::Metrics;
use crate::rlqs::RlqsState;
use crate::rls::RlsState;

/// What the handlers share.
pub struct AppState {
    /// Decides requests.
    pub engine: Engine,
    /// Counters and histograms.
    pub metrics: Arc<Metrics>,
    /// The bearer token callers must present, if any.
    pub token: Option<String>,
    /// Whether `/metrics` asks for the token too.
    pub metrics_need_token: bool,
    /// Whether callers may supply the time (replay mode).
    pub replay_time: bool,
    /// Envoy's gRPC rate limit service, when configured.
    pub rls: Option<Arc<RlsState>>,
    /// Envoy's Rate Limit Quota Service, when configured.
    pub rlqs: Option<Arc<RlqsState>>,
    /// Warnings of failed requests, written at most once a second each.
    pub failure_warnings: Arc<FailureWarnings>,
    /// Turns true when the server begins to shut down: what never ends by itself (a quota
    /// stream) ends then.
    pub stopping: tokio::sync::watch::Receiver<bool>,
}
