//! Protocol v1 between the filter and sluice-server: one `POST /v1/decide` per request, carrying
//! every check that request needs, answered check by check.
//!
//! ```text
//! POST /v1/decide
//! content-type: application/json          (optional: the body is JSON either way, and the
//!                                          filters leave it out, to spare Envoy the header)
//! authorization: Bearer <token>           (when the server is started with a token)
//!
//! {"checks": [{"rule": "per-ip", "key": "203.0.113.7",
//!              "limit": {"algorithm": "gcra", "rate": 10, "per": "1s", "burst": 10},
//!              "cost": 1}]}
//!
//! 200 {"results": [{"allowed": true, "limit": 10, "remaining": 9, "reset_ms": 100,
//!                   "retry_after_ms": 0, "delay_ms": 0}]}
//! 400 {"error": "checks[0].limit: algorithm `gcra` needs `burst`"}
//! 503 {"error": "redis: ..."}
//! ```
//!
//! The checks are decided together, all or nothing ([`crate::algorithm::decide_all`]): when an
//! enforced (non-shadow) check denies, the request is denied and consumes nothing from any
//! rule; the checks that would have admitted it answer as asked at cost 0. Each check names
//! its own rule and key: a request naming one twice is refused.
//!
//! Leases ([`crate::lease`]) have their own endpoint: one `POST /v1/lease` carries every ask of
//! one holder (an Envoy), each for one rule and key.
//!
//! ```text
//! POST /v1/lease
//! {"holder": "envoy-7f9c:17637000012345",
//!  "asks": [{"rule": "per-tenant", "key": "acme",
//!            "limit": {"algorithm": "gcra", "rate": 1000, "per": "1s", "burst": 1000},
//!            "terms": {"max_units": 100, "max_outstanding": 500, "ttl": "1s"},
//!            "want": 80, "held": 12, "returning": 0, "demand": 400}]}
//!
//! 200 {"grants": [{"granted": 80, "lease_ms": 1000, "more_in_ms": 0,
//!                  "limit": 1000, "remaining": 377, "pace_us": 0}]}
//! ```
//!
//! Time comes from Redis. A server started in replay mode also accepts the time from the
//! [`REPLAY_TIME_HEADER`] header (microseconds since the epoch); any other server refuses a
//! request that carries it.

mod compact;
mod decide;
mod lease;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

pub use self::compact::{
    CheckTemplate, read_canonical, read_canonical_request, read_decide_response,
    read_decide_response_into, write_decide_request, write_decide_response, write_json_string,
};
pub use self::decide::{Check, DecideRequest, DecideResponse};
pub use self::lease::{
    LeaseAsk, LeaseGrant, LeaseRequest, LeaseResponse, LeaseTerms, MAX_LEASE_TTL_MS,
    MAX_SECRET_LEN, holder_name, holder_secret, lease_refusal, share_over_span,
};

/// The path of the decision endpoint.
pub const DECIDE_PATH: &str = "/v1/decide";
/// The header a replaying host sets to the virtual time, in microseconds since the epoch.
pub const REPLAY_TIME_HEADER: &str = "x-sluice-replay-time-us";
/// The path of the lease endpoint.
pub const LEASE_PATH: &str = "/v1/lease";
/// The most checks one request may carry.
pub const MAX_CHECKS: usize = 16;
/// The most asks one lease call may carry.
pub const MAX_ASKS: usize = 64;
/// The longest holder name.
pub const MAX_HOLDER_LEN: usize = 128;
/// The largest request body the server reads.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The body of every 4xx and 5xx answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, naming the field for a bad request.
    pub error: String,
}

/// Why a body was refused: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
#[non_exhaustive]
pub struct WireError {
    /// The offending field's path (`checks[1].cost`), or `body` (`response body` for an
    /// answer) when it is the whole of it.
    pub path: String,
    /// Why it was refused.
    pub reason: String,
}

impl WireError {
    pub(crate) fn at(path: impl Into<String>, reason: impl Into<String>) -> WireError {
        WireError {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

/// Deserializes `body`, naming the field of an error by its path.
pub(crate) fn parse_with_path<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, WireError> {
    // Most bodies are fine: parse them plainly, and track the path only to explain an error.
    if let Ok(value) = serde_json::from_slice::<T>(body) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path == "?" {
            WireError::at("body", inner.to_string())
        } else {
            WireError::at(path, inner.to_string())
        }
    })?;
    de.end().map_err(|e| WireError::at("body", e.to_string()))?;
    Ok(value)
}
