//! Protocol v1 between the filter and sluice-server: one `POST /v1/decide` per request, carrying
//! every check that request needs, answered check by check.
//!
//! ```text
//! POST /v1/decide
//! content-type: application/json
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
//! Time comes from Redis. A server started in replay mode also accepts the time from the
//! [`REPLAY_TIME_HEADER`] header (microseconds since the epoch); any other server refuses a
//! request that carries it.

use serde::{Deserialize, Serialize};

use crate::key::{LimitKey, RuleName};
use crate::limit::{Limit, MAX_AMOUNT};
use crate::verdict::Verdict;

/// The path of the decision endpoint.
pub const DECIDE_PATH: &str = "/v1/decide";
/// The header a replaying host sets to the virtual time, in microseconds since the epoch.
pub const REPLAY_TIME_HEADER: &str = "x-sluice-replay-time-us";
/// The most checks one request may carry.
pub const MAX_CHECKS: usize = 16;
/// The largest request body the server reads.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// One call: every check of one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideRequest {
    /// The checks, decided in order.
    pub checks: Vec<Check>,
}

/// One rule's question about one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    /// The rule asking.
    pub rule: RuleName,
    /// The escaped key within that rule.
    pub key: LimitKey,
    /// The limit to apply.
    pub limit: Limit,
    /// Units this request consumes; 0 only asks.
    #[serde(default = "one")]
    pub cost: u64,
    /// Whether a denial consumes too.
    #[serde(default, skip_serializing_if = "is_false")]
    pub count_denied: bool,
    /// A shadow check is decided and counted but never denies the request.
    #[serde(default, skip_serializing_if = "is_false")]
    pub shadow: bool,
}

fn one() -> u64 {
    1
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The answer: one verdict per check, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideResponse {
    /// `results[i]` answers `checks[i]`.
    pub results: Vec<Verdict>,
}

/// The body of every 4xx and 5xx answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, naming the field for a bad request.
    pub error: String,
}

/// Why a request body was refused. The message starts with the path of the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WireError(pub String);

impl DecideRequest {
    /// Parses and validates a request body; the error names the field and the reason.
    pub fn from_json(body: &[u8]) -> Result<DecideRequest, WireError> {
        // Most bodies are fine: parse them plainly, and track the path only to explain an error.
        if let Ok(request) = serde_json::from_slice::<DecideRequest>(body) {
            request.validate()?;
            return Ok(request);
        }
        let mut de = serde_json::Deserializer::from_slice(body);
        let request: DecideRequest = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path == "." || path == "?" {
                WireError(format!("body: {inner}"))
            } else {
                WireError(format!("{path}: {inner}"))
            }
        })?;
        de.end().map_err(|e| WireError(format!("body: {e}")))?;
        request.validate()?;
        Ok(request)
    }

    fn validate(&self) -> Result<(), WireError> {
        if self.checks.is_empty() {
            return Err(WireError("checks: must hold at least one check".into()));
        }
        if self.checks.len() > MAX_CHECKS {
            return Err(WireError(format!(
                "checks: at most {MAX_CHECKS} checks per request, not {}",
                self.checks.len()
            )));
        }
        for (i, check) in self.checks.iter().enumerate() {
            if check.cost > MAX_AMOUNT {
                return Err(WireError(format!(
                    "checks[{i}].cost: must be at most {MAX_AMOUNT}, not {}",
                    check.cost
                )));
            }
            if let Some(first) = self.checks[..i]
                .iter()
                .position(|c| c.rule == check.rule && c.key == check.key)
            {
                return Err(WireError(format!(
                    "checks[{i}]: rule `{}` with key `{}` is already checks[{first}]",
                    check.rule, check.key
                )));
            }
        }
        Ok(())
    }

    /// Parses the response to this request, checking that it answers every check.
    pub fn parse_response(&self, body: &[u8]) -> Result<DecideResponse, WireError> {
        let response: DecideResponse =
            serde_json::from_slice(body).map_err(|e| WireError(format!("response body: {e}")))?;
        if response.results.len() != self.checks.len() {
            return Err(WireError(format!(
                "response body: {} results for {} checks",
                response.results.len(),
                self.checks.len()
            )));
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> String {
        DecideRequest::from_json(body.as_bytes()).unwrap_err().0
    }

    const CHECK: &str =
        r#"{"rule":"r","key":"k","limit":{"algorithm":"fixed_window","limit":5,"window":"1s"}}"#;

    #[test]
    fn a_minimal_request_parses_with_defaults() {
        let req =
            DecideRequest::from_json(format!(r#"{{"checks":[{CHECK}]}}"#).as_bytes()).unwrap();
        assert_eq!(req.checks[0].cost, 1);
        assert!(!req.checks[0].shadow);
    }

    #[test]
    fn errors_name_the_field() {
        assert!(err("{").starts_with("body:"), "{}", err("{"));
        assert!(err(r#"{"checks":[]}"#).starts_with("checks: must hold"));
        assert!(
            err(r#"{"checks":[{"rule":"a b","key":"k","limit":{}}]}"#)
                .starts_with("checks[0].rule:")
        );
        assert!(
            err(r#"{"checks":[{"rule":"r","key":"a}b","limit":{}}]}"#)
                .starts_with("checks[0].key:")
        );
        let bad_limit = r#"{"checks":[{"rule":"r","key":"k","limit":{"algorithm":"leaky"}}]}"#;
        assert!(
            err(bad_limit).contains("unknown algorithm `leaky`"),
            "{}",
            err(bad_limit)
        );
        assert!(
            err(bad_limit).starts_with("checks[0].limit"),
            "{}",
            err(bad_limit)
        );
        let bad_type = r#"{"checks":[{"rule":"r","key":"k","limit":{"algorithm":"gcra","rate":"ten","per":"1s","burst":1}}]}"#;
        assert!(
            err(bad_type).starts_with("checks[0].limit.rate:"),
            "{}",
            err(bad_type)
        );
        let many = format!(r#"{{"checks":[{}]}}"#, vec![CHECK; 17].join(","));
        assert!(err(&many).contains("at most 16 checks"));
        let costly = r#"{"checks":[{"rule":"r","key":"k","limit":{"algorithm":"fixed_window","limit":5,"window":"1s"},"cost":1000000001}]}"#;
        assert!(
            err(costly).starts_with("checks[0].cost: must be at most"),
            "{}",
            err(costly)
        );
        assert!(
            err(&format!(r#"{{"checks":[{CHECK}],"extra":1}}"#)).contains("unknown field `extra`")
        );
        assert_eq!(
            err(&format!(r#"{{"checks":[{CHECK},{CHECK}]}}"#)),
            "checks[1]: rule `r` with key `k` is already checks[0]"
        );
    }
}
