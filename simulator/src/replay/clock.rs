//! The clock a replay runs on: virtual, with a modelled callout latency, or the wall clock.
//! The wall clock is read here and nowhere else in the simulator ([`wall_now`]; the lint
//! `clippy::disallowed_methods` holds every other module to it): a replay in virtual time
//! reads it only to say how long the replay took.

use std::time::{Duration, Instant};

/// The wall clock: for pacing a real-time replay, timing callouts that really travel, and
/// how long a replay took.
#[allow(clippy::disallowed_methods)] // the simulator's one reading of the wall clock
pub fn wall_now() -> Instant {
    Instant::now()
}

/// The modelled time from a callout to its answer.
pub const DEFAULT_CALLOUT_LATENCY: Duration = Duration::from_millis(1);

/// The clock a replay runs on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Clock {
    /// As fast as the machine goes; answers arrive `callout_latency` after their callout.
    Virtual {
        /// The modelled time from a callout to its answer.
        callout_latency: Duration,
    },
    /// Paced by the wall clock at `speed` trace seconds per wall second; answers arrive when
    /// they arrive.
    RealTime {
        /// The speed-up factor (1: as recorded).
        speed: f64,
    },
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::Virtual {
            callout_latency: DEFAULT_CALLOUT_LATENCY,
        }
    }
}
