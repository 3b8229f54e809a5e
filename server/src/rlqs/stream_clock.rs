//! The time a quota stream goes by: the process' monotonic clock over gRPC, or a replay's.

use std::time::Instant;

/// The time a stream goes by.
#[derive(Debug, Clone, Copy)]
pub(super) enum StreamClock {
    /// This process' monotonic clock, from when the stream opened; Redis' time decides.
    Wall(Instant),
    /// A replay's: the stream is told the time at each report and step, and the scripts
    /// decide in it.
    Replay { opened_us: i64, now_us: i64 },
}

impl StreamClock {
    /// Milliseconds since the stream opened.
    pub(super) fn now_ms(&self) -> u64 {
        match *self {
            StreamClock::Wall(opened) => {
                u64::try_from(opened.elapsed().as_millis()).unwrap_or(u64::MAX)
            }
            StreamClock::Replay { opened_us, now_us } => {
                u64::try_from(now_us.saturating_sub(opened_us) / 1000).unwrap_or(0)
            }
        }
    }

    /// The time the scripts decide in: Redis' own, or the replay's.
    pub(super) fn replay_us(&self) -> Option<i64> {
        match *self {
            StreamClock::Wall(_) => None,
            StreamClock::Replay { now_us, .. } => Some(now_us),
        }
    }
}
