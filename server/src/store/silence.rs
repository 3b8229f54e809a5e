//! Telling a dead connection from a slow one.
//!
//! A Redis whose host vanishes without a word (powered off, its address moved to another pod, a
//! partition) leaves the server's connection open: nothing on it fails until the kernel gives up
//! retransmitting, about 15 minutes later, and the Redis client reconnects only on a failure.
//! Every call meanwhile times out, even once a Redis answers at that address again or, on a
//! Cluster, once a replica has taken over the primary's slots. So the store opens a new
//! connection when calls have had no answer for a while: long enough that a Redis merely slow,
//! or busy for a moment (a fork, a long script), answers some call first, and at most once a
//! while, so that a Redis that is up but stuck is not flooded with connections.
//!
//! On a Cluster the other primaries go on answering, so silences are watched by lane: a run of
//! slots, which one primary serves unless the run straddles the edge of its ranges.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Watches calls, by lane, for a silence long enough to take their connection for dead.
#[derive(Debug)]
pub(super) struct SilenceWatch {
    /// The instant times below count from.
    born: Instant,
    /// How long a silence must last.
    limit: Duration,
    /// For each lane, one more than the milliseconds after `born` at which the earliest call
    /// since the lane's last answer was sent; 0 while its calls are answered.
    silent_since: Box<[AtomicU64]>,
    /// Lanes whose `silent_since` is not 0: while none, an answer costs one load.
    silent_lanes: AtomicUsize,
    /// Milliseconds after `born` before which calls went to a connection since replaced.
    fresh_from: AtomicU64,
    /// A replacement is under way.
    replacing: AtomicBool,
}

impl SilenceWatch {
    /// A watch of `lanes` lanes (at least one), from `now`, for silences of `limit` or longer.
    pub(super) fn new(lanes: usize, limit: Duration, now: Instant) -> SilenceWatch {
        SilenceWatch {
            born: now,
            limit,
            silent_since: (0..lanes.max(1)).map(|_| AtomicU64::new(0)).collect(),
            silent_lanes: AtomicUsize::new(0),
            fresh_from: AtomicU64::new(0),
            replacing: AtomicBool::new(false),
        }
    }

    /// Whether some lane has a call unanswered: until then, [`SilenceWatch::answered`] has
    /// nothing to do, and the caller need not work out its lane.
    pub(super) fn watching(&self) -> bool {
        self.silent_lanes.load(Ordering::Relaxed) > 0
    }

    /// A call in `lane` got an answer (any, an error included): its connection is alive.
    pub(super) fn answered(&self, lane: usize) {
        if let Some(since) = self.silent_since.get(lane)
            && since.load(Ordering::Relaxed) != 0
            && since.swap(0, Ordering::Relaxed) != 0
        {
            self.silent_lanes.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// A call in `lane` sent at `sent` had no answer by `now`. When the lane has been silent
    /// for the limit or longer, returns for how long, and claims the replacement: no other call
    /// is told so until [`SilenceWatch::replaced`].
    pub(super) fn unanswered(&self, lane: usize, sent: Instant, now: Instant) -> Option<Duration> {
        let slot = self.silent_since.get(lane)?;
        let sent = self
            .millis(sent)
            .max(self.fresh_from.load(Ordering::Relaxed));
        let since = match slot.compare_exchange(0, sent + 1, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => {
                self.silent_lanes.fetch_add(1, Ordering::Relaxed);
                sent
            }
            Err(earlier) => earlier - 1,
        };
        let silent = now.saturating_duration_since(self.born + Duration::from_millis(since));
        if silent < self.limit || self.replacing.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(silent)
    }

    /// The replacement is done, whether a new connection opened or not: calls sent before
    /// `now` no longer count, and every lane's silence is measured afresh.
    pub(super) fn replaced(&self, now: Instant) {
        self.fresh_from.store(self.millis(now), Ordering::Relaxed);
        for lane in 0..self.silent_since.len() {
            self.answered(lane);
        }
        self.replacing.store(false, Ordering::Release);
    }

    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.born).as_millis()).unwrap_or(u64::MAX - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock;

    const LIMIT: Duration = Duration::from_secs(3);
    const TIMEOUT: Duration = Duration::from_millis(100);

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    /// `unanswered` for a call in `lane` that timed out at `ms`.
    fn timed_out(watch: &SilenceWatch, lane: usize, start: Instant, ms: u64) -> Option<Duration> {
        watch.unanswered(lane, at(start, ms) - TIMEOUT, at(start, ms))
    }

    #[test]
    fn a_connection_silent_for_the_limit_is_replaced_once() {
        let start = clock::monotonic();
        let watch = SilenceWatch::new(1, LIMIT, start);
        assert!(!watch.watching());
        assert_eq!(timed_out(&watch, 0, start, 1_100), None);
        assert!(watch.watching());
        assert_eq!(timed_out(&watch, 0, start, 2_500), None);
        assert_eq!(
            timed_out(&watch, 0, start, 4_000),
            Some(Duration::from_millis(3_000)),
            "silent since the first unanswered call was sent, at 1 s"
        );
        assert_eq!(
            timed_out(&watch, 0, start, 4_100),
            None,
            "one replacement at a time"
        );
    }

    #[test]
    fn any_answer_starts_the_silence_over() {
        let start = clock::monotonic();
        let watch = SilenceWatch::new(1, LIMIT, start);
        assert_eq!(timed_out(&watch, 0, start, 1_000), None);
        watch.answered(0);
        assert!(!watch.watching());
        assert_eq!(timed_out(&watch, 0, start, 3_500), None);
        assert_eq!(timed_out(&watch, 0, start, 6_000), None);
        assert!(timed_out(&watch, 0, start, 6_500).is_some());
    }

    #[test]
    fn after_a_replacement_calls_to_the_old_connection_do_not_count() {
        let start = clock::monotonic();
        let watch = SilenceWatch::new(1, LIMIT, start);
        assert_eq!(timed_out(&watch, 0, start, 1_000), None);
        assert!(timed_out(&watch, 0, start, 4_000).is_some());
        watch.replaced(at(start, 4_050));
        assert!(!watch.watching());
        // A call sent to the old connection before the replacement, timing out after it.
        assert_eq!(timed_out(&watch, 0, start, 4_100), None);
        // The new connection silent too: replaced again a whole limit after the replacement.
        assert_eq!(timed_out(&watch, 0, start, 7_000), None);
        assert!(timed_out(&watch, 0, start, 7_100).is_some());
    }

    #[test]
    fn answers_in_other_lanes_do_not_hide_a_silent_one() {
        let start = clock::monotonic();
        let watch = SilenceWatch::new(4, LIMIT, start);
        assert_eq!(timed_out(&watch, 2, start, 1_000), None);
        for lane in [0, 1, 3] {
            watch.answered(lane);
        }
        assert!(watch.watching());
        assert!(timed_out(&watch, 2, start, 4_000).is_some());
        assert_eq!(
            watch.unanswered(4, at(start, 9_000), at(start, 9_100)),
            None
        );
    }
}
