//! `POST /v1/decide`: a request's checks, and the verdicts that answer them.

use serde::{Deserialize, Serialize};

use super::{MAX_CHECKS, WireError, parse_with_path, read_canonical_request, read_decide_response};
use crate::key::{LimitKey, RuleName};
use crate::limit::{Limit, MAX_AMOUNT};
use crate::verdict::Verdict;

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
