//! Pure reference models of the six algorithms.
//!
//! Each model is a function of a limit, the key's stored state (if any) and one request; it
//! returns the [`Verdict`] and what to store. The models read no clock and own no storage: the
//! caller passes `now` and applies the [`Update`] atomically. The Lua scripts in `lua/` compute
//! the very same numbers in Redis, so that a test can hold the two against each other field by
//! field. Both are exact: every number an answer carries is the floor or ceiling of the exact
//! rational value, whatever the epoch (see [`exact`]).
//!
//! Rules every algorithm follows:
//! - Time is in microseconds. A caller whose clock lags the key's latest time never sees a
//!   fresher state than the key has (windows count it into the newest window, the log raises
//!   its `now` to the newest entry, buckets decide it at its own time against the stored
//!   arrival time), so concurrent callers with skewed clocks cannot over-admit.
//! - `cost` 0 asks without consuming and never writes.
//! - A cost above the limit's capacity is denied with `retry_after_ms: None` and consumes
//!   nothing, whatever `count_denied` says.
//! - A denied request consumes nothing unless `count_denied` is set; then it is counted, with
//!   the debt bounded so that state stays small (documented per algorithm).
//! - Every write carries a time to live after which an absent key means the same as the state.

mod all_or_nothing;
pub mod exact;
pub mod fixed_window;
pub mod gcra;
pub mod leaky_bucket;
pub mod schedule;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

pub use all_or_nothing::{CheckInput, decide_all};

use crate::limit::Limit;
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

/// The stored state of any algorithm.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// See [`fixed_window::State`].
    FixedWindow(fixed_window::State),
    /// See [`sliding_log::State`].
    SlidingLog(sliding_log::State),
    /// See [`sliding_window::State`].
    SlidingWindow(sliding_window::State),
    /// See [`token_bucket::State`].
    TokenBucket(token_bucket::State),
    /// See [`leaky_bucket::State`].
    LeakyBucket(leaky_bucket::State),
    /// See [`gcra::State`].
    Gcra(gcra::State),
}

impl Limit {
    /// Decides `request` against this limit given the key's state, as the Lua script would.
    ///
    /// A state of another algorithm is treated as absent (keys differ by algorithm, so this only
    /// happens in tests that misuse the store).
    pub fn decide(&self, state: Option<&State>, request: Request) -> Outcome<State> {
        fn lift<S>(outcome: Outcome<S>, wrap: fn(S) -> State) -> Outcome<State> {
            Outcome {
                verdict: outcome.verdict,
                update: match outcome.update {
                    Update::Keep => Update::Keep,
                    Update::Write { state, ttl_ms } => Update::Write {
                        state: wrap(state),
                        ttl_ms,
                    },
                },
            }
        }
        macro_rules! dispatch {
            ($($variant:ident => $model:ident),* $(,)?) => {
                match self {
                    $(Limit::$variant(limit) => {
                        let state = match state {
                            Some(State::$variant(state)) => Some(state),
                            _ => None,
                        };
                        lift($model::decide(limit, state, request), State::$variant)
                    })*
                }
            };
        }
        dispatch! {
            FixedWindow => fixed_window,
            SlidingLog => sliding_log,
            SlidingWindow => sliding_window,
            TokenBucket => token_bucket,
            LeakyBucket => leaky_bucket,
            Gcra => gcra,
        }
    }
}
