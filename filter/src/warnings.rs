//! The filter's warnings for failures that repeat with every request (the limit service down,
//! lease calls failing), written at most once a second per worker with how many were left out.
//! The counters count every one (`callout_failures`, `lease_call_failures`).

use std::cell::RefCell;

use proxy_wasm::hostcalls;
use proxy_wasm::types::LogLevel;
use sluice_core::throttle::Throttle;

/// How often, at most, each warning is written by one worker.
const INTERVAL_US: u64 = 1_000_000;

/// Which warning.
#[derive(Debug, Clone, Copy)]
pub enum Warning {
    /// A decision's callout failed; the failure mode applied.
    Callout,
    /// A lease callout could not be sent.
    LeaseNotSent,
    /// A lease call failed.
    LeaseCall,
}

/// Each warning's schedule, for one worker's VM.
pub struct Warnings {
    throttles: [RefCell<Throttle>; 3],
}

impl Default for Warnings {
    fn default() -> Warnings {
        Warnings {
            throttles: std::array::from_fn(|_| RefCell::new(Throttle::new(INTERVAL_US))),
        }
    }
}

impl Warnings {
    /// Writes `message` at warning level if `warning` is due at `now_us`, saying how many of
    /// its kind were left out since the last.
    pub fn warn(&self, warning: Warning, now_us: u64, message: impl FnOnce() -> String) {
        let Some(left_out) = self.throttles[warning as usize].borrow_mut().due(now_us) else {
            return;
        };
        let mut line = message();
        if left_out > 0 {
            line.push_str(&format!(
                " ({left_out} more like it in this worker since the last such line)"
            ));
        }
        let _ = hostcalls::log(LogLevel::Warn, &line);
    }
}
