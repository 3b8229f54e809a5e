//! `ShouldRateLimit` taken before the router: a plain gRPC unary call (one uncompressed
//! message in, one out) is read, decided and answered here, with the call itself in
//! [`super::service::should_rate_limit`], as tonic would answer it.
//!
//! Envoy's `ratelimit` filter sends nothing else, and through axum's router and tonic's
//! generic codec a call cost the server 9,500 instructions more than the decision (callgrind,
//! 75,900 a call against 52,300 for `/v1/decide` from the wasm filter). Any other call
//! (compressed, another content type) still goes to tonic, which answers it as before.

use std::convert::Infallible;

use axum::body::{Body, Bytes, HttpBody};
use axum::response::Response;
use http::{HeaderMap, HeaderValue, Method, header};
use http_body_util::BodyExt;
use prost::Message;
use tonic::Status;

use crate::answer_body::FramedByStream;
use crate::app_state::AppState;
use crate::envoy_api::ratelimit::{RateLimitRequest, SHOULD_RATE_LIMIT};
use crate::inbound::whole_body;

use super::service::should_rate_limit;

/// The largest message taken, as tonic's default.
const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// A gRPC message's prefix: a compression flag and the length (big-endian).
const PREFIX_BYTES: usize = 5;

/// Whether `request` is a call this module answers: `ShouldRateLimit`, as gRPC over protobuf,
/// uncompressed.
pub fn takes<B>(request: &http::Request<B>) -> bool {
    let headers = request.headers();
    request.method() == Method::POST
        && request.uri().path() == SHOULD_RATE_LIMIT
        && headers.get(header::CONTENT_TYPE).is_some_and(|t| {
            t.as_bytes() == b"application/grpc" || t.as_bytes() == b"application/grpc+proto"
        })
        && headers
            .get("grpc-encoding")
            .is_none_or(|e| e.as_bytes() == b"identity")
}

/// Answers a call [`takes`] took.
pub async fn answer<B: HttpBody<Data = Bytes>>(
    state: &AppState,
    request: http::Request<B>,
) -> Response {
    let (parts, body) = request.into_parts();
    let answered = async {
        let body = whole_body(body, PREFIX_BYTES + MAX_MESSAGE_BYTES)
            .await
            .ok_or_else(|| {
                Status::out_of_range(format!(
                    "the request message is larger than {MAX_MESSAGE_BYTES} bytes, or cut short"
                ))
            })?;
        let request = RateLimitRequest::decode(message(&body)?)
            .map_err(|e| Status::internal(format!("failed to decode Protobuf message: {e}")))?;
        should_rate_limit(state, &parts.headers, request).await
    }
    .await;
    match answered {
        Ok(response) => reply(&response.encode_to_vec()),
        Err(status) => status.into_http(),
    }
}

/// The one message of a unary call's body (or of its answer's).
pub fn message(body: &[u8]) -> Result<&[u8], Status> {
    let Some((prefix, message)) = body.split_first_chunk::<PREFIX_BYTES>() else {
        return Err(Status::internal("Missing request message."));
    };
    if prefix[0] != 0 {
        return Err(Status::internal(
            "protocol error: received message with compressed-flag but no grpc-encoding was specified",
        ));
    }
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if message.len() != length {
        return Err(Status::internal(format!(
            "the body holds {} bytes after its prefix, which says {length}: a unary call and its answer each carry one whole message",
            message.len()
        )));
    }
    Ok(message)
}

/// `message` as a unary call's body (or its answer's): uncompressed, after its length.
pub fn framed(message: &[u8]) -> Vec<u8> {
    let mut framed = Vec::with_capacity(PREFIX_BYTES + message.len());
    framed.push(0);
    // Messages past 4 GiB do not exist here: the largest answer is a few kilobytes.
    framed.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    framed.extend_from_slice(message);
    framed
}

/// A gRPC answer of `message`, with the trailers saying the call succeeded.
fn reply(message: &[u8]) -> Response {
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let body = FramedByStream::new(Bytes::from(framed(message)))
        .with_trailers(async { Some(Ok::<_, Infallible>(trailers)) });
    let mut response = Response::new(Body::new(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(flag: u8, length: u32, message: &[u8]) -> Vec<u8> {
        let mut body = vec![flag];
        body.extend_from_slice(&length.to_be_bytes());
        body.extend_from_slice(message);
        body
    }

    #[test]
    fn the_message_is_what_the_prefix_says_and_anything_else_is_named() {
        assert_eq!(message(&framed(0, 3, b"abc")).unwrap(), b"abc");
        assert_eq!(message(&framed(0, 0, b"")).unwrap(), b"");
        let refused = |body: &[u8]| message(body).unwrap_err().message().to_owned();
        assert_eq!(refused(b""), "Missing request message.");
        assert!(refused(&framed(1, 3, b"abc")).contains("compressed-flag"));
        assert!(refused(&framed(0, 4, b"abc")).contains("holds 3 bytes"));
        assert!(refused(&framed(0, 2, b"abc")).contains("which says 2"));
    }

    #[test]
    fn only_plain_should_rate_limit_calls_are_taken() {
        let call = |path: &str, content_type: &str, encoding: Option<&str>| {
            let mut request = http::Request::post(path).header(header::CONTENT_TYPE, content_type);
            if let Some(encoding) = encoding {
                request = request.header("grpc-encoding", encoding);
            }
            takes(&request.body(()).unwrap())
        };
        assert!(call(SHOULD_RATE_LIMIT, "application/grpc", None));
        assert!(call(
            SHOULD_RATE_LIMIT,
            "application/grpc+proto",
            Some("identity")
        ));
        assert!(!call(SHOULD_RATE_LIMIT, "application/grpc", Some("gzip")));
        assert!(!call(SHOULD_RATE_LIMIT, "application/json", None));
        assert!(!call(
            "/grpc.health.v1.Health/Check",
            "application/grpc",
            None
        ));
    }
}
