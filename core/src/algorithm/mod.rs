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
mod model;
pub mod schedule;
pub mod sliding_log;
pub mod sliding_window;
mod state;
pub mod token_bucket;

pub use all_or_nothing::{CheckInput, decide_all};
pub use model::{Outcome, Request, Update};
pub use state::State;

use crate::limit::Limit;

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
