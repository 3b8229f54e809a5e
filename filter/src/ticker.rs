//! Who needs the root context's tick, and how often: held (shaped) requests want it every
//! 5 ms, leases at their own period, the counters every [`FLUSH_EVERY`] once configured; the
//! tick runs at the shortest period wanted, and stops when nothing wants it.

use std::cell::Cell;
use std::time::Duration;

use proxy_wasm::hostcalls;

use sluice_filter_logic::lease::LeaseTick;

use crate::stats::FLUSH_EVERY;

/// How often held requests are looked at: the precision of shaping.
pub const SHAPING_TICK: Duration = Duration::from_millis(5);

/// Sets the root context's tick period (zero: none); false when refused.
pub type SetPeriod = Box<dyn Fn(Duration) -> bool>;

/// The tick's users in one VM.
pub struct Ticker {
    holding: Cell<bool>,
    leasing: Cell<Option<Duration>>,
    counting: Cell<bool>,
    current: Cell<Duration>,
    set_period: SetPeriod,
}

impl Default for Ticker {
    /// The host's tick.
    fn default() -> Ticker {
        // The tick belongs to the root context whatever the calling context.
        Ticker::new(Box::new(|period| {
            hostcalls::set_tick_period(period).is_ok()
        }))
    }
}

impl Ticker {
    /// A ticker that sets the period with `set_period`.
    pub fn new(set_period: SetPeriod) -> Ticker {
        Ticker {
            holding: Cell::new(false),
            leasing: Cell::new(None),
            counting: Cell::new(false),
            current: Cell::new(Duration::ZERO),
            set_period,
        }
    }

    /// Whether requests are held.
    pub fn set_holding(&self, holding: bool) {
        self.holding.set(holding);
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
        if wanted != self.current.get() && (self.set_period)(wanted) {
            self.current.set(wanted);
        }
    }
}

impl LeaseTick for Ticker {
    /// Whether leases need looking after, and how often.
    fn set_leasing(&self, period: Option<Duration>) {
        self.leasing.set(period);
        self.apply();
    }
}
