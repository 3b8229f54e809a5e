//! Telling a dead connection from a slow one.
//!
//! A Redis whose host vanishes without a word (powered off, its address moved to another pod, a
//! partition) leaves the server's connection open: nothing on it fails until the kernel gives up
//! retransmitting, about 15 minutes later, and the Redis client reconnects only on a failure.
//! Every call meanwhile times out, even once a Redis answers at that address again. So the
//! store opens a new connection when the one it has has answered nothing for a while: long
//! enough that a Redis merely slow, or busy for a moment (a fork, a long script), answers some
//! call first, and at most once a while, so that a Redis that is up but stuck is not flooded
//! with connections.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Watches one connection's calls for a silence long enough to take it for dead.
#[derive(Debug)]
pub(super) struct SilenceWatch {
    /// The instant times below count from.
    born: Instant,
    /// How long a silence must last.
    limit: Duration,
    /// One more than the milliseconds after `born` at which the earliest call since the last
    /// answer was sent; 0 while calls are answered.
    silent_since: AtomicU64,
    /// Milliseconds after `born` before which calls went to a connection since replaced.
    fresh_from: AtomicU64,
    /// A replacement is under way.
    replacing: AtomicBool,
}

impl SilenceWatch {
    /// A watch, from `now`, for silences of `limit` or longer.
    pub(super) fn new(limit: Duration, now: Instant) -> SilenceWatch {
        SilenceWatch {
            born: now,
            limit,
            silent_since: AtomicU64::new(0),
            fresh_from: AtomicU64::new(0),
            replacing: AtomicBool::new(false),
        }
    }

    /// A call got an answer (any, an error included): the connection is alive. One load on
    /// the way of every call.
    pub(super) fn answered(&self) {
        if self.silent_since.load(Ordering::Relaxed) != 0 {
            self.silent_since.store(0, Ordering::Relaxed);
        }
    }

    /// A call sent at `sent` had no answer by `now`. When the connection has been silent for
    /// the limit or longer, returns for how long, and claims the replacement: no other call is
    /// told so until [`SilenceWatch::replaced`].
    pub(super) fn unanswered(&self, sent: Instant, now: Instant) -> Option<Duration> {
        let sent = self
            .millis(sent)
            .max(self.fresh_from.load(Ordering::Relaxed));
        let since = match self.silent_since.compare_exchange(
            0,
            sent + 1,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => sent,
            Err(earlier) => earlier - 1,
        };
        let silent = now.saturating_duration_since(self.born + Duration::from_millis(since));
        if silent < self.limit || self.replacing.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(silent)
    }

    /// The replacement is done, whether a new connection opened or not: calls sent before
    /// `now` no longer count, and the silence is measured afresh.
    pub(super) fn replaced(&self, now: Instant) {
        self.fresh_from.store(self.millis(now), Ordering::Relaxed);
        self.silent_since.store(0, Ordering::Relaxed);
        self.replacing.store(false, Ordering::Release);
    }

    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.born).as_millis()).unwrap_or(u64::MAX - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(3);
    const TIMEOUT: Duration = Duration::from_millis(100);

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    /// `unanswered` for a call that timed out at `ms`.
    fn timed_out(watch: &SilenceWatch, start: Instant, ms: u64) -> Option<Duration> {
        watch.unanswered(at(start, ms) - TIMEOUT, at(start, ms))
    }

    #[test]
    fn a_connection_silent_for_the_limit_is_replaced_once() {
        let start = Instant::now();
        let watch = SilenceWatch::new(LIMIT, start);
        assert_eq!(timed_out(&watch, start, 1_100), None);
        assert_eq!(timed_out(&watch, start, 2_500), None);
        assert_eq!(
            timed_out(&watch, start, 4_000),
            Some(Duration::from_millis(3_000)),
            "silent since the first unanswered call was sent, at 1 s"
        );
        assert_eq!(
            timed_out(&watch, start, 4_100),
            None,
            "one replacement at a time"
        );
    }

    #[test]
    fn any_answer_starts_the_silence_over() {
        let start = Instant::now();
        let watch = SilenceWatch::new(LIMIT, start);
        assert_eq!(timed_out(&watch, start, 1_000), None);
        watch.answered();
        assert_eq!(timed_out(&watch, start, 3_500), None);
        assert_eq!(timed_out(&watch, start, 6_000), None);
        assert!(timed_out(&watch, start, 6_500).is_some());
    }

    #[test]
    fn after_a_replacement_calls_to_the_old_connection_do_not_count() {
        let start = Instant::now();
        let watch = SilenceWatch::new(LIMIT, start);
        assert_eq!(timed_out(&watch, start, 1_000), None);
        assert!(timed_out(&watch, start, 4_000).is_some());
        watch.replaced(at(start, 4_050));
        // A call sent to the old connection before the replacement, timing out after it.
        assert_eq!(timed_out(&watch, start, 4_100), None);
        // The new connection silent too: replaced again a whole limit after the replacement.
        assert_eq!(timed_out(&watch, start, 7_000), None);
        assert!(timed_out(&watch, start, 7_100).is_some());
    }
}
