//! The answer to one check: what every algorithm returns, the Lua scripts and the models alike.

use serde::{Deserialize, Serialize};

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

    /// Whether the request was denied because it can never pass.
    pub fn is_impossible(&self) -> bool {
        !self.allowed && self.retry_after_ms.is_none()
    }
}
