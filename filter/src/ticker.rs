//! Who needs the root context's tick, and how often: held (shaped) requests want it every
//! 5 ms, leases at their own period, the counters every [`FLUSH_EVERY`] once configured; the
//! tick runs at the shortest period wanted, and stops when nothing wants it.

use std::cell::Cell;
use std::time::Duration;

use proxy_wasm::hostcalls;

use crate::stats::FLUSH_EVERY;

/// How often held requests are looked at: the precision of shaping.
pub const SHAPING_TICK: Duration = Duration::from_millis(5);

/// The tick's users in one VM.
#[derive(Default)]
pub struct Ticker {
    holding: Cell<bool>,
    leasing: Cell<Option<Duration>>,
    counting: Cell<bool>,
    current: Cell<Duration>,
}

impl Ticker {
    /// Whether requests are held.
    pub fn set_holding(&self, holding: bool) {
        self.holding.set(holding);
        self.apply();
    }

    /// Whether leases need looking after, and how often.
    pub fn set_leasing(&self, period: Option<Duration>) {
        self.leasing.set(period);
        self.apply();
    }

    /// Whether counters wait for the tick to be handed to Envoy.
    pub fn set_counting(&self, counting: bool) {
        self.counting.set(counting);
        self.apply();
    }

    fn apply(&self) {
        let wanted = [
            self.holding.get().then_some(SHAPING_TICK),
            self.leasing.get(),
            self.counting.get().then_some(FLUSH_EVERY),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(Duration::ZERO);
        if wanted != self.current.get() {
            // The tick belongs to the root context whatever the calling context.
            if hostcalls::set_tick_period(wanted).is_ok() {
                self.current.set(wanted);
            }
        }
    }
}
