//! Serving in the same process: requests handed to the router as values.
//!
//! The simulator runs the server in its own process. Over loopback TCP a third of a replay's
//! CPU went to the kernel moving bytes between its two halves; over in-memory streams a quarter
//! still went to hyper writing and parsing HTTP/1 on both sides. Handed over as
//! `http::Request` values, requests meet the same service, extractors, validation, engine and
//! Redis as over a socket; only the HTTP/1 codec is skipped.

use std::convert::Infallible;

use axum::body::Body;
use tower_service::Service as _;

use crate::http::Service;

/// A server reached by calling it: cheap to clone, every clone the same server.
#[derive(Clone, Debug)]
pub struct InProcessServer {
    service: Service,
}

impl InProcessServer {
    pub(crate) fn new(service: Service) -> InProcessServer {
        InProcessServer { service }
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
