//! Keeping a test that counts on one fixed window clear of the window's end.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Returns once the current window of length `window` has at least `needed` left, sleeping
/// into the next one if not. Fixed windows start at multiples of their length since the Unix
/// epoch, on Redis' clock, which is this machine's: a test that counts requests in one window
/// and sees it turn over finds the counts gone, or a fresh window's requests admitted, in the
/// middle of the test.
pub fn clear_of_window_end(window: Duration, needed: Duration) {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let left = window_left(since_epoch, window);
    if left < needed {
        std::thread::sleep(left + Duration::from_millis(100));
    }
}

/// How much of the window of length `window` that holds `since_epoch` is still to come.
fn window_left(since_epoch: Duration, window: Duration) -> Duration {
    let window_us = window.as_micros().max(1);
    let into_us = since_epoch.as_micros() % window_us;
    Duration::from_micros(u64::try_from(window_us - into_us).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_left_runs_down_to_the_next_multiple_of_the_window() {
        let minute = Duration::from_secs(60);
        assert_eq!(window_left(Duration::from_secs(120), minute), minute);
        assert_eq!(
            window_left(Duration::from_millis(179_900), minute),
            Duration::from_millis(100)
        );
        let thirty_days = Duration::from_secs(30 * 86_400);
        assert_eq!(
            window_left(thirty_days * 681 + Duration::from_secs(1), thirty_days),
            thirty_days - Duration::from_secs(1)
        );
    }
}
