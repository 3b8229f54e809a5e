//! The body of an answer sent on every request (`/v1/decide`, gRPC `ShouldRateLimit`).
//!
//! Over HTTP/2 the stream's end frames a body, and a `content-length` beside it is one more
//! header for the caller to decode, store and check against the data: Envoy's HTTP/2 client
//! spent about 2,700 instructions on it an answer, some 2 % of a callout's cost to Envoy
//! (docs/performance-log.md). hyper writes one for every body whose size it knows; this body
//! does not tell it. Over HTTP/1.1 the header is what frames a body (without it hyper would
//! send the body chunked), so there the answer keeps it.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use http::Version;
use http_body::Frame;

/// `bytes` as the body of an answer to a request of `version`: with `content-length` over
/// HTTP/1, without it over HTTP/2.
pub fn answer_body(version: Version, bytes: Bytes) -> Body {
    if version == Version::HTTP_2 {
        Body::new(FramedByStream::new(bytes))
    } else {
        Body::from(bytes)
    }
}

/// A whole body whose length only the end of its stream says.
pub struct FramedByStream(Option<Bytes>);

impl FramedByStream {
    /// `bytes`, to be sent as one data frame that ends the stream (or its trailers follow).
    pub fn new(bytes: Bytes) -> FramedByStream {
        FramedByStream(Some(bytes))
    }
}

impl HttpBody for FramedByStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.take().map(|bytes| Ok(Frame::data(bytes))))
    }

    // Said, so that hyper ends the stream with the data frame rather than an empty one after
    // it. `size_hint` is left at its default, an unknown size: that is the point.
    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }
}
