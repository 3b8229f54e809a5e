//! The answer to one check: what every algorithm returns, the Lua scripts and the models alike.

use serde::{Deserialize, Serialize};

use crate::limit::Limit;

/// The decision on one check and the numbers a client needs to behave well.
///
/// `retry_after_ms` is `None` when the request can never pass (its cost exceeds the limit's
/// capacity); a client must not be told to come back for a request that no wait will admit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verdict {
    /// Whether the request may pass.
    pub allowed: bool,
    /// The limit's capacity (window limit or bucket burst).
    pub limit: u64,
    /// Units left for further requests right after this decision.
    pub remaining: u64,
    /// Milliseconds until the limit is fully restored, with no further traffic.
    pub reset_ms: u64,
    /// Milliseconds until a request of the same cost could pass; 0 when allowed; `None` never.
    pub retry_after_ms: Option<u64>,
    /// Milliseconds the request must be held before it goes on (leaky bucket shaping only).
    #[serde(default)]
    pub delay_ms: u64,
}

impl Verdict {
    /// A request that asks for more than the limit's capacity: denied, and no wait helps.
    pub fn impossible(limit: u64, remaining: u64, reset_ms: u64) -> Verdict {
        Verdict {
            allowed: false,
            limit,
            remaining,
            reset_ms,
            retry_after_ms: None,
            delay_ms: 0,
        }
    }

    /// Whether this can be the answer to a check of `limit`: every algorithm reports the
    /// limit's capacity, never more remaining than that, and a delay only within a shaping
    /// bucket's `max_wait`. An answer that breaks these is garbage, however well formed.
    pub fn check_against(&self, limit: &Limit) -> Result<(), Contradiction> {
        let capacity = limit.capacity();
        if self.limit != capacity {
            return Err(Contradiction::Limit {
                limit: self.limit,
                capacity,
            });
        }
        if self.remaining > capacity {
            return Err(Contradiction::Remaining {
                remaining: self.remaining,
                capacity,
            });
        }
        let max_wait_ms = limit.max_wait_ms();
        if self.delay_ms > max_wait_ms {
            return Err(Contradiction::Delay {
                delay_ms: self.delay_ms,
                max_wait_ms,
            });
        }
        Ok(())
    }
}

/// How a verdict contradicts the limit it answers; reads as the rest of `results[i].`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Contradiction {
    /// It reports another capacity.
    #[error("limit is {limit}, not the rule's {capacity}")]
    Limit {
        /// Reported.
        limit: u64,
        /// The rule's.
        capacity: u64,
    },
    /// More remaining than the limit holds.
    #[error("remaining is {remaining}, more than the rule's limit of {capacity}")]
    Remaining {
        /// Reported.
        remaining: u64,
        /// The rule's.
        capacity: u64,
    },
    /// A delay beyond what the rule lets a request be held.
    #[error("delay_ms is {delay_ms}, longer than the rule's max_wait ({max_wait_ms} ms)")]
    Delay {
        /// Reported.
        delay_ms: u64,
        /// The rule's (0 unless it shapes).
        max_wait_ms: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(json: &str) -> Limit {
        serde_json::from_str(json).unwrap()
    }

    fn allowed(limit: u64, remaining: u64, delay_ms: u64) -> Verdict {
        Verdict {
            allowed: true,
            limit,
            remaining,
            reset_ms: 100,
            retry_after_ms: Some(0),
            delay_ms,
        }
    }

    #[test]
    fn a_verdict_must_report_its_limits_capacity_and_no_more_remaining() {
        let gcra = limit(r#"{"algorithm":"gcra","rate":10,"per":"1s","burst":20}"#);
        assert_eq!(allowed(20, 20, 0).check_against(&gcra), Ok(()));
        assert_eq!(
            allowed(10, 5, 0).check_against(&gcra),
            Err(Contradiction::Limit {
                limit: 10,
                capacity: 20
            })
        );
        let err = allowed(20, 21, 0).check_against(&gcra).unwrap_err();
        assert_eq!(
            err.to_string(),
            "remaining is 21, more than the rule's limit of 20"
        );
    }

    #[test]
    fn only_a_shaping_bucket_may_delay_and_never_past_its_max_wait() {
        let shaping = limit(
            r#"{"algorithm":"leaky_bucket","rate":5,"per":"1s","burst":10,"mode":"shaping","max_wait":"2s"}"#,
        );
        assert_eq!(allowed(10, 0, 2000).check_against(&shaping), Ok(()));
        let err = allowed(10, 0, 2001).check_against(&shaping).unwrap_err();
        assert_eq!(
            err.to_string(),
            "delay_ms is 2001, longer than the rule's max_wait (2000 ms)"
        );
        let meter = limit(r#"{"algorithm":"leaky_bucket","rate":5,"per":"1s","burst":10}"#);
        assert!(allowed(10, 0, 1).check_against(&meter).is_err());
        let window = limit(r#"{"algorithm":"sliding_window","limit":10,"window":"1m"}"#);
        assert!(allowed(10, 0, 1).check_against(&window).is_err());
        assert_eq!(allowed(10, 0, 0).check_against(&window), Ok(()));
    }
}
