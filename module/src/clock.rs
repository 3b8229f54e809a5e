//! Where the module's time comes from: the process' clock, which is Envoy's. Nothing else in
//! the module reads a clock (the lint `clippy::disallowed_methods` holds every other module
//! to it); the filter logic is handed the time.

// The one module that reads the process' clocks.
#![allow(clippy::disallowed_methods)]

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The time in microseconds since the epoch.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The process' monotonic clock: how long the lease thread has waited.
pub fn monotonic() -> Instant {
    Instant::now()
}
