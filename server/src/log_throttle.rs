//! Warnings that every failing request would repeat, written at most once an interval.
//!
//! While Redis is down every decision fails, tens of thousands a second: a line each would
//! bury the log (and bill its pipeline) without saying more than the first. The metrics count
//! every failure; the log says what is wrong, once an interval, with how many it left out.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often, at most, a failing request's warning is written.
pub const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// One warning's schedule: when it was last written, and how many times it was due since.
#[derive(Debug)]
pub struct LogThrottle {
    interval: Duration,
    state: Mutex<Written>,
}

#[derive(Debug, Default)]
struct Written {
    last: Option<Instant>,
    left_out: u64,
}

impl LogThrottle {
    /// A warning written at most once every `interval`.
    pub fn new(interval: Duration) -> LogThrottle {
        LogThrottle {
            interval,
            state: Mutex::new(Written::default()),
        }
    }

    /// Whether to write the warning now (the first time, and once the interval has passed),
    /// with how many times it was left out since it was last written.
    pub fn due(&self, now: Instant) -> Option<u64> {
        let mut written = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if written
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < self.interval)
        {
            written.left_out += 1;
            return None;
        }
        written.last = Some(now);
        Some(std::mem::take(&mut written.left_out))
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_warning_is_written_then_one_an_interval_with_the_count_left_out() {
        let throttle = LogThrottle::new(Duration::from_secs(1));
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        assert_eq!(throttle.due(at(0)), Some(0));
        assert_eq!(throttle.due(at(1)), None);
        assert_eq!(throttle.due(at(999)), None);
        assert_eq!(
            throttle.due(at(1000)),
            Some(2),
            "two left out since the first"
        );
        assert_eq!(throttle.due(at(1500)), None);
        assert_eq!(throttle.due(at(5000)), Some(1));
        assert_eq!(
            throttle.due(at(4000)),
            None,
            "a clock read late does not write again"
        );
    }
}
