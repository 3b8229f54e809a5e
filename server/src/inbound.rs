//! What every API reads of a request alike, over HTTP and gRPC: its whole body within a
//! limit, its bearer token, and a replay's time.

use axum::body::{Bytes, HttpBody};
use axum::http::{HeaderMap, header};
use sluice_core::wire::REPLAY_TIME_HEADER;

use crate::app_state::AppState;

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
