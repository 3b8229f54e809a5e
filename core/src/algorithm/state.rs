//! The stored state of any of the six algorithms, one variant each.

use super::{fixed_window, gcra, leaky_bucket, sliding_log, sliding_window, token_bucket};

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
