//! Warnings that every failing request would repeat, written at most once an interval.
//!
//! While Redis is down every decision fails, tens of thousands a second: a line each would
//! bury the log (and bill its pipeline) without saying more than the first. The metrics count
//! every failure; the log says what is wrong, once an interval, with how many it left out.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sluice_core::throttle::Throttle;

use crate::clock;

/// How often, at most, a failing request's warning is written.
pub const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// One warning's schedule, shared by the server's tasks.
#[derive(Debug)]
pub struct LogThrottle {
    /// The instant the throttle's microseconds count from.
    since: Instant,
    throttle: Mutex<Throttle>,
}

impl LogThrottle {
    /// A warning written at most once every `interval`.
    pub fn new(interval: Duration) -> LogThrottle {
        LogThrottle {
            since: clock::monotonic(),
            throttle: Mutex::new(Throttle::new(
                u64::try_from(interval.as_micros()).unwrap_or(u64::MAX),
            )),
        }
    }

    /// Whether to write the warning now (the first time, and once the interval has passed),
    /// with how many times it was left out since it was last written.
    pub fn due(&self, now: Instant) -> Option<u64> {
        let now_us = u64::try_from(now.saturating_duration_since(self.since).as_micros())
            .unwrap_or(u64::MAX);
        self.throttle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .due(now_us)
    }
}

impl Default for LogThrottle {
    fn default() -> LogThrottle {
        LogThrottle::new(FAILURE_LOG_INTERVAL)
    }
}

/// The warnings of requests that failed for want of Redis, each on its own throttle.
#[derive(Debug, Default)]
pub struct FailureWarnings {
    /// `POST /v1/decide`.
    pub decide: LogThrottle,
    /// `POST /v1/lease`.
    pub lease: LogThrottle,
    /// Envoy's `ShouldRateLimit`.
    pub should_rate_limit: LogThrottle,
    /// The quota service's fundings.
    pub quota_funding: LogThrottle,
    /// Quota buckets refused for a cap.
    pub quota_buckets: LogThrottle,
}

#[cfg(test)]
mod tests {
    use super::*;

    // The schedule itself is sluice_core::throttle's, tested there; this is its clock.
    #[test]
    fn instants_count_from_the_throttles_making() {
        let throttle = LogThrottle::new(Duration::from_secs(1));
        let start = clock::monotonic();
        let at = |ms| start + Duration::from_millis(ms);
        assert_eq!(throttle.due(at(0)), Some(0));
        assert_eq!(throttle.due(at(999)), None);
        assert_eq!(throttle.due(at(1000)), Some(1));
    }
}
