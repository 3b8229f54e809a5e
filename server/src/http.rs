//! The HTTP surface: `/v1/decide`, `/v1/lease`, `/healthz`, `/readyz`, `/metrics`.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::future::RouteFuture;
use axum::routing::{get, post};
use futures::future::{BoxFuture, Either};
use sluice_core::wire::{
    DECIDE_PATH, DecideRequest, ErrorBody, LEASE_PATH, LeaseRequest, MAX_BODY_BYTES,
    REPLAY_TIME_HEADER, WireError, write_decide_response,
};

use crate::engine::{Engine, LeaseError};
use crate::log_throttle::FailureWarnings;
use crate::metrics::Metrics;
use crate::rlqs::RlqsState;
use crate::rls::{RlsState, unary};

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

/// A 200 answer with a JSON body already written, as `axum::Json` would send it.
fn json(body: Vec<u8>) -> Response {
    let mut response = Response::new(Body::from(body));
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

/// All of `body`, or `None` past `limit` bytes or when it fails. A call's body nearly always
/// comes in one frame, which is kept as it is: axum's `to_bytes`, which gathers frames in a
/// list behind a size limit, cost a decision about 0.4k instructions more (callgrind).
pub(crate) async fn whole_body<B: HttpBody<Data = Bytes>>(body: B, limit: usize) -> Option<Bytes> {
    if body.size_hint().lower() > limit as u64 {
        return None;
    }
    let mut body = std::pin::pin!(body);
    let mut first = Bytes::new();
    let mut gathered = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let Ok(data) = frame.ok()?.into_data() else {
            continue;
        };
        // Once a second chunk came, `gathered` holds the first too.
        let so_far = if gathered.is_empty() {
            first.len()
        } else {
            gathered.len()
        };
        if so_far + data.len() > limit {
            return None;
        }
        if first.is_empty() && gathered.is_empty() {
            first = data;
        } else {
            if gathered.is_empty() {
                gathered.extend_from_slice(&first);
            }
            gathered.extend_from_slice(&data);
        }
    }
    Some(if gathered.is_empty() {
        first
    } else {
        Bytes::from(gathered)
    })
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
    let started = Instant::now();
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
            json(body)
        }
        Err(e) => {
            if let Some(left_out) = state.failure_warnings.decide.due(Instant::now()) {
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
            if let Some(left_out) = state.failure_warnings.lease.due(Instant::now()) {
                tracing::warn!(error = %e, left_out, "lease failed");
            }
            error(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
        }
    }
}

/// Checks the bearer token, if the server wants one; the error says what is wrong.
pub(crate) fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), &'static str> {
    let Some(token) = &state.token else {
        return Ok(());
    };
    let presented = bearer_token(headers)?;
    if constant_time_eq(presented, token.as_bytes()) {
        Ok(())
    } else {
        Err("authorization: wrong bearer token")
    }
}

/// The token of the one `Authorization: Bearer <token>` header, read as RFC 9110 reads it: the
/// scheme in any case, whitespace around the value not part of it (so HTTP/1.1 and HTTP/2,
/// whose parsers differ there, read one header alike). Two such headers are refused: a proxy
/// and this server could each read a different one.
fn bearer_token(headers: &HeaderMap) -> Result<&[u8], &'static str> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(if headers.contains_key(header::AUTHORIZATION) {
            "authorization: more than one Authorization header"
        } else {
            "authorization: a bearer token is required"
        });
    };
    let value = value.as_bytes().trim_ascii();
    let scheme_ends = value
        .iter()
        .position(|&b| b == b' ' || b == b'\t')
        .unwrap_or(value.len());
    let (scheme, token) = value.split_at(scheme_ends);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return Err("authorization: a bearer token is required");
    }
    match token.trim_ascii_start() {
        [] => Err("authorization: a bearer token is required"),
        token => Ok(token),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub(crate) fn replay_time(state: &AppState, headers: &HeaderMap) -> Result<Option<i64>, String> {
    let Some(value) = headers.get(REPLAY_TIME_HEADER) else {
        return Ok(None);
    };
    if !state.replay_time {
        return Err(format!(
            "{REPLAY_TIME_HEADER}: this server takes its time from Redis; start it with --replay-time to accept a caller's time"
        ));
    }
    value
        .to_str()
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|t| t.unsigned_abs() < 1 << 53)
        .map(Some)
        .ok_or_else(|| format!("{REPLAY_TIME_HEADER}: must be whole microseconds since the epoch"))
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
        .set_redis_clock_uncertainty(state.engine.clock().uncertainty_us(Instant::now()));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use bytes::Bytes;
    use http_body_util::StreamBody;
    use hyper::body::Frame;

    use super::{bearer_token, whole_body};

    type Chunks = futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>;

    /// A body that arrives as `chunks`.
    fn chunked(chunks: &[usize]) -> StreamBody<Chunks> {
        let frames: Vec<_> = chunks
            .iter()
            .map(|&n| Ok(Frame::data(Bytes::from(vec![b'x'; n]))))
            .collect();
        StreamBody::new(futures::stream::iter(frames))
    }

    fn gathered(chunks: &[usize], limit: usize) -> Option<usize> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        runtime
            .block_on(whole_body(chunked(chunks), limit))
            .map(|b| b.len())
    }

    #[test]
    fn a_body_under_the_limit_is_taken_whatever_its_chunks() {
        // Three chunks of 20,000 (60,000 in all) once counted the first twice: 80,000.
        assert_eq!(gathered(&[20_000, 20_000, 20_000], 65_536), Some(60_000));
        assert_eq!(gathered(&[65_536], 65_536), Some(65_536));
        assert_eq!(gathered(&[1; 100], 100), Some(100));
    }

    #[test]
    fn a_body_over_the_limit_is_refused_whatever_its_chunks() {
        assert_eq!(gathered(&[20_000, 20_000, 25_537], 65_536), None);
        assert_eq!(gathered(&[65_537], 65_536), None);
        assert_eq!(gathered(&[1; 101], 100), None);
    }

    fn token_of(values: &[&str]) -> Result<String, &'static str> {
        let mut headers = axum::http::HeaderMap::new();
        for value in values {
            headers.append(
                axum::http::header::AUTHORIZATION,
                axum::http::HeaderValue::from_str(value).unwrap(),
            );
        }
        bearer_token(&headers).map(|t| String::from_utf8_lossy(t).into_owned())
    }

    #[test]
    fn the_bearer_scheme_is_read_in_any_case_and_whitespace_around_the_value_is_not_the_token() {
        for value in [
            "Bearer T",
            "bearer T",
            "BEARER T",
            "Bearer T ",
            " Bearer  T\t",
        ] {
            assert_eq!(token_of(&[value]).as_deref(), Ok("T"), "{value:?}");
        }
        for value in ["Basic T", "BearerT", "Bearer", "Bearer   ", "T"] {
            assert_eq!(
                token_of(&[value]),
                Err("authorization: a bearer token is required"),
                "{value:?}"
            );
        }
        assert_eq!(
            token_of(&[]),
            Err("authorization: a bearer token is required")
        );
    }

    #[test]
    fn two_authorization_headers_are_refused_even_when_one_is_right() {
        assert_eq!(
            token_of(&["Bearer T", "Bearer T"]),
            Err("authorization: more than one Authorization header")
        );
        assert_eq!(
            token_of(&["Bearer wrong", "Bearer T"]),
            Err("authorization: more than one Authorization header")
        );
    }
}
