//! What every model takes and gives: one request in; a verdict and what to store out.

use crate::verdict::Verdict;

/// One request against one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The time of the decision, in microseconds since the Unix epoch.
    pub now_us: i64,
    /// How many units the request consumes; 0 only asks.
    pub cost: u64,
    /// Whether a denied request consumes too.
    pub count_denied: bool,
}

impl Request {
    /// A request for one unit at `now_us` that, denied, consumes nothing: a rule's defaults.
    pub fn one_at(now_us: i64) -> Request {
        Request {
            now_us,
            cost: 1,
            count_denied: false,
        }
    }
}

/// What to do with a key's state after a decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Update<S> {
    /// Leave the key as it is (absent stays absent).
    Keep,
    /// Store `state` and let the key expire after `ttl_ms`.
    Write {
        /// The new state.
        state: S,
        /// Milliseconds until the key may vanish; at least 1.
        ttl_ms: u64,
    },
}

/// A verdict and the state change that goes with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome<S> {
    /// The answer.
    pub verdict: Verdict,
    /// What to store.
    pub update: Update<S>,
}
