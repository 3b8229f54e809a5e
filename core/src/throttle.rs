//! Warnings that every failing request would repeat, let through at most once an interval.
//!
//! While the limit service or Redis is down every decision fails, thousands a second: a log
//! line each would bury the log (Envoy's, sluice-server's) without saying more than the first.
//! The counters count every failure; the log says what is wrong once an interval, with how
//! many it left out. Clock-free: the caller passes the time, in microseconds on any clock
//! that does not go back.

/// One warning's schedule: when it was last let through, and how many times it was due since.
#[derive(Debug, Clone)]
pub struct Throttle {
    interval_us: u64,
    last_us: Option<u64>,
    left_out: u64,
}

impl Throttle {
    /// A warning let through at most once every `interval_us`.
    pub fn new(interval_us: u64) -> Throttle {
        Throttle {
            interval_us,
            last_us: None,
            left_out: 0,
        }
    }

    /// Whether to write the warning at `now_us` (the first time, and once the interval has
    /// passed), with how many times it was left out since it was last written.
    pub fn due(&mut self, now_us: u64) -> Option<u64> {
        if self
            .last_us
            .is_some_and(|last| now_us.saturating_sub(last) < self.interval_us)
        {
            self.left_out += 1;
            return None;
        }
        self.last_us = Some(now_us);
        Some(std::mem::take(&mut self.left_out))
    }
}

#[cfg(test)]
mod tests {
    use super::Throttle;

    #[test]
    fn the_first_is_let_through_then_one_an_interval_with_the_count_left_out() {
        let mut throttle = Throttle::new(1_000_000);
        assert_eq!(throttle.due(0), Some(0));
        assert_eq!(throttle.due(1), None);
        assert_eq!(throttle.due(999_999), None);
        assert_eq!(throttle.due(1_000_000), Some(2));
        assert_eq!(throttle.due(1_500_000), None);
        assert_eq!(throttle.due(5_000_000), Some(1));
    }

    #[test]
    fn a_clock_that_went_back_lets_nothing_more_through() {
        let mut throttle = Throttle::new(1_000_000);
        assert_eq!(throttle.due(5_000_000), Some(0));
        assert_eq!(throttle.due(4_000_000), None);
    }
}
