//! What the root context and its streams share: a configuration with its counters, caches,
//! leases and held streams; and that, in the proxy-wasm host, as the requests' [`Glue`].

use std::rc::Rc;
use std::time::UNIX_EPOCH;

use proxy_wasm::hostcalls;
use sluice_core::deny_cache::{Entry, EntryId};
use sluice_core::key::LimitKey;
use sluice_core::lease::LeaseConfig;
use sluice_core::policy::{Policy, Rule};
use sluice_core::record::{DECISION_PROPERTY, RuleOutcome};
use sluice_filter_logic::lease::{Leases, Reservation};
use sluice_filter_logic::shared_data::SharedData;
use sluice_filter_logic::{Glue, Local};

use crate::cache::DenyCache;
use crate::ffi;
use crate::held::SharedHeld;
use crate::stats::Stats;
use crate::ticker::Ticker;
use crate::warnings::{Warning, Warnings};

/// A configured root context: what it and every one of its streams share.
pub struct Configured {
    /// The validated configuration.
    pub policy: Policy,
    /// The counters.
    pub stats: Stats,
    /// The deny cache.
    pub cache: DenyCache,
    /// Streams held for shaping.
    pub held: SharedHeld,
    /// The leased rules' allowances.
    pub leases: WorkerLeases,
    /// Warnings that would repeat with every request, throttled.
    pub warnings: Warnings,
}

/// The leases of one worker's VM, over the host's shared data and the root context's tick.
pub type WorkerLeases = Leases<Rc<dyn SharedData>, Rc<Ticker>>;

/// Host time in microseconds since the epoch; 0 should the host not say (the SDK's
/// `get_current_time` would panic).
pub fn now_us() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Glue for Configured {
    type Reservation = Reservation;

    fn policy(&self) -> &Policy {
        &self.policy
    }

    fn now_us(&self) -> u64 {
        now_us()
    }

    /// In the filter state `wasm.sluice.decision`.
    fn record(&self, decision: &[u8]) {
        ffi::set_filter_state(DECISION_PROPERTY, decision);
    }

    fn count_outcome(&self, rule: usize, outcome: RuleOutcome, delayed: bool, local: bool) {
        self.stats.outcome(rule, outcome, delayed, local);
    }

    fn count_callout(&self, rules: impl Iterator<Item = usize>) {
        self.stats.callout(rules);
    }

    fn callout_failed(&self, now_us: u64, reason: &str) {
        self.warnings.warn(Warning::Callout, now_us, || {
            format!("sluice: {reason}; failure mode applies")
        });
        self.stats.callout_failure();
    }

    fn count_client_ip_fallback(&self) {
        self.stats.client_ip_fallback();
    }

    fn cache_enabled(&self) -> bool {
        self.cache.enabled()
    }

    fn cache_lookup(&self, id: EntryId<'_>, now_ms: u64) -> Option<Entry> {
        self.cache.lookup(id, now_ms)
    }

    fn cache_remember(&self, entry: &Entry, now_ms: u64) {
        self.cache.remember(entry, now_ms);
    }

    fn take_lease(
        &self,
        rule_index: usize,
        rule: &Rule,
        config: &LeaseConfig,
        key: &LimitKey,
        now_us: u64,
    ) -> Local<Reservation> {
        self.leases.take(rule_index, rule, config, key, now_us)
    }

    fn give_back(&self, reservation: &Reservation, rule_index: usize, key: &LimitKey, now_us: u64) {
        self.leases.give_back(reservation, rule_index, key, now_us);
    }
}
