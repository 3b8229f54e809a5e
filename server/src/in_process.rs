//! Serving in the same process: requests handed to the router as values.
//!
//! The simulator runs the server in its own process. Over loopback TCP a third of a replay's
//! CPU went to the kernel moving bytes between its two halves; over in-memory streams a quarter
//! still went to hyper writing and parsing HTTP/1 on both sides. Handed over as
//! `http::Request` values, requests meet the same service, extractors, validation, engine and
//! Redis as over a socket; only the HTTP/1 codec is skipped.

use std::convert::Infallible;

use std::sync::Arc;

use axum::body::Body;
use tower_service::Service as _;

use crate::app_state::AppState;
use crate::http::Service;
use crate::rlqs::replay::ReplayStream;

/// A server reached by calling it: cheap to clone, every clone the same server.
#[derive(Clone)]
pub struct InProcessServer {
    service: Service,
    state: Arc<AppState>,
}

impl std::fmt::Debug for InProcessServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessServer")
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

impl InProcessServer {
    pub(crate) fn new(service: Service, state: Arc<AppState>) -> InProcessServer {
        InProcessServer { service, state }
    }

    /// A quota stream in a replay's time, opened at `now_us`; `None` when the server has no
    /// quota configuration. It must be used within the server's runtime.
    pub fn quota_stream(&self, now_us: i64) -> Option<ReplayStream> {
        let rlqs = self.state.rlqs.as_ref()?;
        Some(ReplayStream::open(
            Arc::clone(&self.state),
            Arc::clone(rlqs),
            now_us,
        ))
    }

    /// Answers `request` as the server would over HTTP.
    pub async fn call(&self, request: http::Request<Body>) -> http::Response<Body> {
        let answered: Result<http::Response<Body>, Infallible> =
            self.service.clone().call(request).await;
        match answered {
            Ok(response) => response,
        }
    }
}
