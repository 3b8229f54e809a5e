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

use serde::{Deserialize, Serialize};

pub use compact::{
    CheckTemplate, read_canonical, read_canonical_request, read_decide_response,
    write_decide_request, write_decide_response, write_json_string,
};

use crate::duration::Millis;
use crate::key::{LimitKey, RuleName};
use crate::limit::{LeakMode, Limit, MAX_AMOUNT};
use crate::verdict::Verdict;

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
    fn at(path: impl Into<String>, reason: impl Into<String>) -> WireError {
        WireError {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

impl DecideRequest {
    /// Parses and validates a request body; the error names the field and the reason.
    pub fn from_json(body: &[u8]) -> Result<DecideRequest, WireError> {
        let request = match read_canonical_request(body) {
            Some(request) => request,
            None => parse_with_path(body)?,
        };
        request.validate()?;
        Ok(request)
    }

    fn validate(&self) -> Result<(), WireError> {
        if self.checks.is_empty() {
            return Err(WireError::at("checks", "must hold at least one check"));
        }
        if self.checks.len() > MAX_CHECKS {
            return Err(WireError::at(
                "checks",
                format!(
                    "at most {MAX_CHECKS} checks per request, not {}",
                    self.checks.len()
                ),
            ));
        }
        for (i, check) in self.checks.iter().enumerate() {
            if check.cost > MAX_AMOUNT {
                return Err(WireError::at(
                    format!("checks[{i}].cost"),
                    format!("must be at most {MAX_AMOUNT}, not {}", check.cost),
                ));
            }
            if let Some(first) = self.checks[..i]
                .iter()
                .position(|c| c.rule == check.rule && c.key == check.key)
            {
                return Err(WireError::at(
                    format!("checks[{i}]"),
                    format!(
                        "rule `{}` with key `{}` is already checks[{first}]",
                        check.rule, check.key
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Parses the response to this request, checking that it answers every check.
    pub fn parse_response(&self, body: &[u8]) -> Result<DecideResponse, WireError> {
        Ok(DecideResponse {
            results: read_decide_response(body, self.checks.len())?,
        })
    }
}

/// The longest lease.
pub const MAX_LEASE_TTL_MS: u64 = 60_000;

/// What the server enforces for one key's leases; sent with every ask (the server keeps no
/// configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseTerms {
    /// The most units one holder may hold for the key.
    pub max_units: u64,
    /// The most units all holders together (and the pool of units given back) may hold for
    /// the key: what the bound adds to the algorithm's.
    pub max_outstanding: u64,
    /// How long a lease lasts after the holder's last call.
    pub ttl: Millis,
}

/// Every lease ask of one holder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// Who holds the leases: one Envoy, named the same by all its workers; 1 to 128 of
    /// `A-Z a-z 0-9 _ . : -`.
    pub holder: String,
    /// The asks, one per rule and key.
    pub asks: Vec<LeaseAsk>,
}

/// One rule and key's ask: report what is held, give back what is not needed, ask for more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseAsk {
    /// The rule.
    pub rule: RuleName,
    /// The escaped key within that rule.
    pub key: LimitKey,
    /// The rule's limit.
    pub limit: Limit,
    /// The caps the server enforces.
    pub terms: LeaseTerms,
    /// Units wanted now (0: only report, give back, or keep the lease alive).
    #[serde(default)]
    pub want: u64,
    /// Units the holder still holds, unspent (not counting `returning`).
    #[serde(default)]
    pub held: u64,
    /// Units the holder gives back: it will never spend them.
    #[serde(default)]
    pub returning: u64,
    /// Units a second the holder's requests ask for (its local demand), from which the server
    /// shares the limit's rate among holders when the key is over it.
    #[serde(default)]
    pub demand: u64,
}

/// The answers, one per ask, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseResponse {
    /// `grants[i]` answers `asks[i]`.
    pub grants: Vec<LeaseGrant>,
}

/// What the server gave one ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseGrant {
    /// New units for the holder (from units given back by holders first, then from the
    /// algorithm).
    pub granted: u64,
    /// The holder's whole lease on the key (old units and new) ends this long after the call.
    pub lease_ms: u64,
    /// When less was granted than wanted because the algorithm admits no more now: how long
    /// until it admits the rest. The holder asks again no sooner, and, holding nothing, denies
    /// requests meanwhile. 0 otherwise (granted in full, or held back by a cap).
    #[serde(default)]
    pub more_in_ms: u64,
    /// The limit's capacity.
    pub limit: u64,
    /// What the algorithm had left after the grant.
    pub remaining: u64,
    /// When the holders' demands add up to more than a bucket's rate: the holder's max-min
    /// fair share of the rate, as microseconds between units; the holder spends no faster, so
    /// that the key's admissions, summed over holders, are as even as the algorithm's. 0:
    /// spend freely (within the rate, or a window algorithm, which admits in bursts by
    /// design).
    #[serde(default)]
    pub pace_us: u64,
    /// When the server counted fewer of the units the ask said were held than it said (their
    /// lease had already ended there, or Redis lost the ledger): how many it still counts.
    /// The holder keeps no more of them than this. Absent when it counted them all, as it
    /// does unless a renewal comes late.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<u64>,
}

fn is_holder(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_HOLDER_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
}

/// Why a lease's terms or limit cannot be leased; `None` when they can.
pub fn lease_refusal(limit: &Limit, terms: &LeaseTerms) -> Option<String> {
    if let Limit::LeakyBucket(l) = limit
        && matches!(l.mode(), LeakMode::Shaping { .. })
    {
        return Some(
            "a shaping leaky bucket cannot be leased: each request needs its own delay".into(),
        );
    }
    if terms.max_units == 0 || terms.max_units > terms.max_outstanding {
        return Some(format!(
            "`max_units` must be between 1 and `max_outstanding` ({}), not {}",
            terms.max_outstanding, terms.max_units
        ));
    }
    if terms.max_outstanding > MAX_AMOUNT {
        return Some(format!(
            "`max_outstanding` must be at most {MAX_AMOUNT}, not {}",
            terms.max_outstanding
        ));
    }
    if terms.ttl.as_millis() > MAX_LEASE_TTL_MS {
        return Some(format!("`ttl` must be at most 1m, not {}", terms.ttl));
    }
    None
}

impl LeaseRequest {
    /// Parses and validates a request body; the error names the field and the reason.
    pub fn from_json(body: &[u8]) -> Result<LeaseRequest, WireError> {
        let request: LeaseRequest = parse_with_path(body)?;
        if !is_holder(&request.holder) {
            return Err(WireError::at(
                "holder",
                format!(
                    "`{}` is not a holder name: use 1 to 128 of A-Z a-z 0-9 _ . : -",
                    request.holder
                ),
            ));
        }
        if request.asks.is_empty() || request.asks.len() > MAX_ASKS {
            return Err(WireError::at(
                "asks",
                format!("must hold 1 to {MAX_ASKS} asks, not {}", request.asks.len()),
            ));
        }
        for (i, ask) in request.asks.iter().enumerate() {
            if let Some(reason) = lease_refusal(&ask.limit, &ask.terms) {
                return Err(WireError::at(format!("asks[{i}]"), reason));
            }
            if ask.demand > MAX_AMOUNT {
                return Err(WireError::at(
                    format!("asks[{i}].demand"),
                    format!("must be at most {MAX_AMOUNT}, not {}", ask.demand),
                ));
            }
            for (field, value) in [
                ("want", ask.want),
                ("held", ask.held),
                ("returning", ask.returning),
            ] {
                if value > ask.terms.max_units {
                    return Err(WireError::at(
                        format!("asks[{i}].{field}"),
                        format!(
                            "must be at most terms.max_units ({}), not {value}",
                            ask.terms.max_units
                        ),
                    ));
                }
            }
            if let Some(first) = request.asks[..i]
                .iter()
                .position(|a| a.rule == ask.rule && a.key == ask.key)
            {
                return Err(WireError::at(
                    format!("asks[{i}]"),
                    format!(
                        "rule `{}` with key `{}` is already asks[{first}]",
                        ask.rule, ask.key
                    ),
                ));
            }
        }
        Ok(request)
    }

    /// Parses the response to this request, checking that it answers every ask within what
    /// was asked: no more units than wanted, no lease longer than the terms' `ttl`. A holder
    /// that took more would break the bound the terms promise, so such an answer is refused
    /// whole.
    pub fn parse_response(&self, body: &[u8]) -> Result<LeaseResponse, WireError> {
        let response: LeaseResponse = serde_json::from_slice(body)
            .map_err(|e| WireError::at("response body", e.to_string()))?;
        if response.grants.len() != self.asks.len() {
            return Err(WireError::at(
                "response body",
                format!(
                    "{} grants for {} asks",
                    response.grants.len(),
                    self.asks.len()
                ),
            ));
        }
        for (i, (ask, grant)) in self.asks.iter().zip(&response.grants).enumerate() {
            if grant.granted > ask.want {
                return Err(WireError::at(
                    "response body",
                    format!(
                        "grants[{i}].granted is {}, more than the {} asked",
                        grant.granted, ask.want
                    ),
                ));
            }
            if let Some(kept) = grant.kept
                && kept > ask.held
            {
                return Err(WireError::at(
                    "response body",
                    format!(
                        "grants[{i}].kept is {kept}, more than the {} held",
                        ask.held
                    ),
                ));
            }
            if grant.lease_ms > ask.terms.ttl.as_millis() {
                return Err(WireError::at(
                    "response body",
                    format!(
                        "grants[{i}].lease_ms is {}, longer than the terms' ttl ({})",
                        grant.lease_ms, ask.terms.ttl
                    ),
                ));
            }
        }
        Ok(response)
    }
}

/// Deserializes `body`, naming the field of an error by its path.
fn parse_with_path<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, WireError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> String {
        DecideRequest::from_json(body.as_bytes())
            .unwrap_err()
            .to_string()
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

    const ASK: &str = r#"{"rule":"r","key":"k","limit":{"algorithm":"gcra","rate":10,"per":"1s","burst":10},"terms":{"max_units":5,"max_outstanding":8,"ttl":"1s"},"want":5}"#;

    fn lease_err(body: &str) -> String {
        LeaseRequest::from_json(body.as_bytes())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn lease_requests_are_validated_field_by_field() {
        let ok = LeaseRequest::from_json(
            format!(r#"{{"holder":"envoy-1:42","asks":[{ASK}]}}"#).as_bytes(),
        )
        .unwrap();
        assert_eq!(
            (ok.asks[0].want, ok.asks[0].held, ok.asks[0].returning),
            (5, 0, 0)
        );
        assert!(lease_err(&format!(r#"{{"holder":"a b","asks":[{ASK}]}}"#)).starts_with("holder:"));
        assert!(lease_err(r#"{"holder":"h","asks":[]}"#).starts_with("asks: must hold 1 to 64"));
        assert_eq!(
            lease_err(&format!(
                r#"{{"holder":"h","asks":[{}]}}"#,
                ASK.replace(r#""want":5"#, r#""want":6"#)
            )),
            "asks[0].want: must be at most terms.max_units (5), not 6"
        );
        assert!(
            lease_err(&format!(
                r#"{{"holder":"h","asks":[{}]}}"#,
                ASK.replace(r#""max_units":5"#, r#""max_units":9"#)
            ))
            .starts_with("asks[0]: `max_units` must be between 1 and `max_outstanding` (8)")
        );
        let shaping = ASK
            .replace(
                r#""burst":10}"#,
                r#""burst":10,"mode":"shaping","max_wait":"1s"}"#,
            )
            .replace("gcra", "leaky_bucket");
        assert!(
            lease_err(&format!(r#"{{"holder":"h","asks":[{shaping}]}}"#))
                .contains("shaping leaky bucket cannot be leased")
        );
        assert_eq!(
            lease_err(&format!(r#"{{"holder":"h","asks":[{ASK},{ASK}]}}"#)),
            "asks[1]: rule `r` with key `k` is already asks[0]"
        );
        assert!(lease_err(r#"{"holder":"h","asks":[{"rule":"r"}]}"#).starts_with("asks[0]"));
    }

    #[test]
    fn a_lease_answer_is_held_to_what_was_asked() {
        let request =
            LeaseRequest::from_json(format!(r#"{{"holder":"h","asks":[{ASK}]}}"#).as_bytes())
                .unwrap();
        let answer = |granted: u64, lease_ms: u64| {
            request.parse_response(
                format!(
                    r#"{{"grants":[{{"granted":{granted},"lease_ms":{lease_ms},"limit":10,"remaining":5}}]}}"#
                )
                .as_bytes(),
            )
        };
        let grant = answer(5, 1000).unwrap().grants[0];
        assert_eq!(
            (grant.granted, grant.lease_ms, grant.more_in_ms),
            (5, 1000, 0)
        );
        assert_eq!(
            answer(6, 1000).unwrap_err().to_string(),
            "response body: grants[0].granted is 6, more than the 5 asked"
        );
        assert_eq!(
            answer(5, 1001).unwrap_err().to_string(),
            "response body: grants[0].lease_ms is 1001, longer than the terms' ttl (1s)"
        );
        assert_eq!(
            request
                .parse_response(br#"{"grants":[]}"#)
                .unwrap_err()
                .to_string(),
            "response body: 0 grants for 1 asks"
        );
        // What the server kept of the units held: absent when all, never more than held.
        let held = |kept: u64| {
            let request = LeaseRequest::from_json(
                format!(
                    r#"{{"holder":"h","asks":[{}]}}"#,
                    ASK.replace(r#""want":5"#, r#""want":5,"held":3"#)
                )
                .as_bytes(),
            )
            .unwrap();
            request.parse_response(
                format!(r#"{{"grants":[{{"granted":0,"lease_ms":1000,"limit":10,"remaining":5,"kept":{kept}}}]}}"#)
                    .as_bytes(),
            )
        };
        assert_eq!(grant.kept, None);
        assert_eq!(held(2).unwrap().grants[0].kept, Some(2));
        assert_eq!(
            held(4).unwrap_err().to_string(),
            "response body: grants[0].kept is 4, more than the 3 held"
        );
    }
}
