//! Where the module's time comes from: the process' clock, which is Envoy's. Nothing else in
//! the module reads a clock (the lint `clippy::disallowed_methods` holds every other module
//! to it); the filter logic is handed the time.

// The one module that reads the process' clocks.
#![allow(clippy::disallowed_methods)]

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The time in microseconds since the epoch.
///
/// Read from `clock_gettime` itself: `SystemTime::now` and `duration_since` around it cost
/// about 85 instructions more, on every request (callgrind).
#[allow(unsafe_code)]
pub fn now_us() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a live local the call writes; CLOCK_REALTIME is always there.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut now) } != 0 {
        return fallback_now_us();
    }
    match (u64::try_from(now.tv_sec), u64::try_from(now.tv_nsec)) {
        (Ok(seconds), Ok(nanos)) => seconds.saturating_mul(1_000_000) + nanos / 1000,
        // Before the epoch.
        _ => 0,
    }
}

/// [`now_us`] through std, should `clock_gettime` ever fail.
fn fallback_now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The process' monotonic clock: how long the lease thread has waited, when a held request
/// is due.
pub fn monotonic() -> Instant {
    Instant::now()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_clock_reads_the_time_std_reads() {
        let before = super::fallback_now_us();
        let now = super::now_us();
        let after = super::fallback_now_us();
        assert!(
            before <= now && now <= after,
            "{before} <= {now} <= {after}"
        );
    }
}
