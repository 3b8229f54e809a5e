//! Where the module's time comes from: the process' clock, which is Envoy's. Nothing else in
//! the module reads a clock; the filter logic is handed the time.

use std::time::{SystemTime, UNIX_EPOCH};

/// The time in microseconds since the epoch.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
