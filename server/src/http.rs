//! The HTTP surface: `/v1/decide`, `/v1/lease`, `/healthz`, `/readyz`, `/metrics`.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::{Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::future::RouteFuture;
use axum::routing::{get, post};
use futures::future::{BoxFuture, Either};
use sluice_core::wire::{
    DECIDE_PATH, DecideRequest, ErrorBody, LEASE_PATH, LeaseRequest, MAX_BODY_BYTES, WireError,
    write_decide_response,
};

use crate::answer_body::answer_body;
use crate::app_state::AppState;
use crate::clock;
use crate::engine::LeaseError;
use crate::inbound::{authorize, replay_time, whole_body};
use crate::rls::unary;

/// A listener's service: the calls that are nearly all its traffic (`POST /v1/decide`, and
/// Envoy's `ShouldRateLimit` where this listener serves gRPC) straight to their handlers,
/// every other request through the router. Axum's routing cost a decision about a tenth of
/// the server's instructions (callgrind, 4.7k of 44.6k).
#[derive(Clone)]
pub struct Service {
    state: Arc<AppState>,
    router: Router,
    shortcuts: Shortcuts,
}

/// Which calls a [`Service`] takes before its router: those its router serves too.
#[derive(Debug, Clone, Copy)]
pub struct Shortcuts {
    /// `POST /v1/decide`.
    pub decide: bool,
    /// gRPC `ShouldRateLimit` ([`crate::rls::unary`]).
    pub should_rate_limit: bool,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("shortcuts", &self.shortcuts)
            .finish_non_exhaustive()
    }
}

impl Service {
    /// `router`, with the calls of `shortcuts` taken before it.
    pub fn new(state: Arc<AppState>, router: Router, shortcuts: Shortcuts) -> Service {
        Service {
            state,
            router,
            shortcuts,
        }
    }
}

impl<B> tower_service::Service<http::Request<B>> for Service
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<BoxFuture<'static, Result<Response, Infallible>>, RouteFuture<Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if self.shortcuts.decide
            && request.method() == Method::POST
            && request.uri().path() == DECIDE_PATH
        {
            let state = Arc::clone(&self.state);
            Either::Left(Box::pin(async move { Ok(decide(&state, request).await) }))
        } else if self.shortcuts.should_rate_limit && unary::takes(&request) {
            let state = Arc::clone(&self.state);
            Either::Left(Box::pin(
                async move { Ok(unary::answer(&state, request).await) },
            ))
        } else {
            Either::Right(self.router.call(request))
        }
    }
}

/// The router.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route(
            DECIDE_PATH,
            post(
                |State(state): State<Arc<AppState>>, request: Request| async move {
                    decide(&state, request).await
                },
            ),
        )
        .route(LEASE_PATH, post(lease))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint".to_owned()) })
        .with_state(state)
}

/// A 200 answer to a request of `version` with a JSON body already written, as `axum::Json`
/// would send it, but for the `content-length` HTTP/2 does without ([`answer_body`]).
fn json(version: http::Version, body: Vec<u8>) -> Response {
    let mut response = Response::new(answer_body(version, Bytes::from(body)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn error(status: StatusCode, message: String) -> Response {
    (status, axum::Json(ErrorBody { error: message })).into_response()
}

/// A call's body and replay time, once its size, token and time header are checked; or the
/// refusal.
async fn admit<B: HttpBody<Data = Bytes>>(
    state: &AppState,
    headers: &HeaderMap,
    body: B,
) -> Result<(Bytes, Option<i64>), Response> {
    let refuse = |status: StatusCode, message: String| {
        state.metrics.bad_request();
        error(status, message)
    };
    let Some(body) = whole_body(body, MAX_BODY_BYTES).await else {
        return Err(refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body: larger than {MAX_BODY_BYTES} bytes, or cut short"),
        ));
    };
    if let Err(refusal) = authorize(state, headers) {
        return Err(refuse(StatusCode::UNAUTHORIZED, refusal.to_owned()));
    }
    let now_us = replay_time(state, headers).map_err(|m| refuse(StatusCode::BAD_REQUEST, m))?;
    Ok((body, now_us))
}

fn bad_request(state: &AppState, e: &WireError) -> Response {
    state.metrics.bad_request();
    tracing::debug!(error = %e, "bad request");
    error(StatusCode::BAD_REQUEST, e.to_string())
}

// Handlers take the whole request: axum's `HeaderMap` extractor would copy the headers. A
// decision's body is read as hyper gives it, not boxed as axum's `Body`.
async fn decide<B: HttpBody<Data = Bytes>>(
    state: &AppState,
    request: http::Request<B>,
) -> Response {
    let started = clock::monotonic();
    let (parts, body) = request.into_parts();
    let (body, now_us) = match admit(state, &parts.headers, body).await {
        Ok(admitted) => admitted,
        Err(refusal) => return refusal,
    };
    let request = match DecideRequest::from_json(&body) {
        Ok(request) => request,
        Err(e) => return bad_request(state, &e),
    };
    match state.engine.decide(&request, now_us).await {
        Ok(response) => {
            state.metrics.decision_time(started.elapsed());
            let mut body = Vec::with_capacity(16 + 112 * response.results.len());
            write_decide_response(&mut body, &response.results);
            json(parts.version, body)
        }
        Err(e) => {
            if let Some(left_out) = state.failure_warnings.decide.due(clock::monotonic()) {
                tracing::warn!(error = %e, left_out, "decision failed");
            }
            error(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
    }
}

async fn lease(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let (body, now_us) = match admit(&state, &parts.headers, body).await {
        Ok(admitted) => admitted,
        Err(refusal) => return refusal,
    };
    let request = match LeaseRequest::from_json(&body) {
        Ok(request) => request,
        Err(e) => return bad_request(&state, &e),
    };
    match state.engine.lease(&request, now_us).await {
        Ok(response) => axum::Json(response).into_response(),
        Err(e @ LeaseError::Stranger { .. }) => error(StatusCode::CONFLICT, e.to_string()),
        Err(e) => {
            if let Some(left_out) = state.failure_warnings.lease.due(clock::monotonic()) {
                tracing::warn!(error = %e, left_out, "lease failed");
            }
            error(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
    }
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    match state.engine.ready().await {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn metrics(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if state.metrics_need_token
        && let Err(e) = authorize(&state, &headers)
    {
        return error(StatusCode::UNAUTHORIZED, e.to_owned());
    }
    state
        .metrics
        .set_redis_functions(state.engine.store().calls_functions());
    state
        .metrics
        .set_redis_clock_uncertainty(state.engine.clock().uncertainty_us(clock::monotonic()));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}
