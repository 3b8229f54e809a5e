//! One filter configuration in Envoy: the policy, the deny cache and the counters every
//! worker's streams share, and, for one stream, the requests' [`Glue`].

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use sluice_core::deny_cache::{Entry, EntryId};
use sluice_core::key::LimitKey;
use sluice_core::lease::LeaseConfig;
use sluice_core::policy::{Policy, PolicyError, Rule};
use sluice_core::record::{DECISION_PROPERTY, RuleOutcome};
use sluice_core::stat_names::{self, RuleStat, rule_stat};
use sluice_core::throttle::Throttle;
use sluice_filter_logic::{Glue, Local};

use crate::abi::LOG_WARN;
use crate::cache::DenyCache;
use crate::envoy::{Config, Filter, log};

/// A validated configuration, shared by every worker (Envoy creates it on the main thread).
pub struct Configured {
    pub policy: Policy,
    pub cache: DenyCache,
    counters: Counters,
    /// When the callout-failure warning is next due: at most one a second for the whole
    /// Envoy, saying how many were left out.
    callout_warning: Mutex<Throttle>,
}

/// The Envoy counters' ids, defined with the configuration.
struct Counters {
    callouts: Option<usize>,
    callout_failures: Option<usize>,
    client_ip_fallbacks: Option<usize>,
    panics: Option<usize>,
    /// Per rule, per [`RuleStat`].
    rules: Vec<[Option<usize>; RuleStat::ALL.len()]>,
}

/// How often, at most, a warning that repeats with every request is written.
const WARN_EVERY_US: u64 = 1_000_000;

/// Why the module refuses a configuration (Envoy then refuses to start, and logs it).
#[derive(Debug)]
pub struct Refused(pub String);

impl Configured {
    /// The configuration of `json` (the filter's `filter_config`), with its counters defined
    /// in `config`.
    pub fn new(config: &Config, json: &[u8]) -> Result<Configured, Refused> {
        let policy = Policy::from_json(json).map_err(|e| Refused(invalid(&e)))?;
        not_yet_supported(&policy)?;
        let rules = policy
            .rules
            .iter()
            .map(|rule| {
                RuleStat::ALL
                    .map(|stat| config.define_counter(&rule_stat(rule.name.as_str(), stat)))
            })
            .collect();
        Ok(Configured {
            cache: DenyCache::new(policy.deny_cache_slots),
            counters: Counters {
                callouts: config.define_counter(stat_names::CALLOUTS),
                callout_failures: config.define_counter(stat_names::CALLOUT_FAILURES),
                client_ip_fallbacks: config.define_counter(stat_names::CLIENT_IP_FALLBACKS),
                panics: config.define_counter(stat_names::PANICS),
                rules,
            },
            policy,
            callout_warning: Mutex::new(Throttle::new(WARN_EVERY_US)),
        })
    }
}

fn invalid(e: &PolicyError) -> String {
    format!("sluice: invalid configuration: {e}")
}

/// Refuses, by the field's path, what the module does not do yet (the .wasm does): leases.
fn not_yet_supported(policy: &Policy) -> Result<(), Refused> {
    for (i, rule) in policy.rules.iter().enumerate() {
        if rule.lease.is_some() {
            return Err(Refused(format!(
                "sluice: invalid configuration: rules[{i}].lease: the native module does not lease yet; load sluice_filter.wasm for leased rules"
            )));
        }
    }
    Ok(())
}

/// The time in microseconds since the epoch: the process' clock, which is Envoy's.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// One stream's view of its configuration: what its request needs of the host.
pub struct StreamGlue<'a> {
    pub configured: &'a Configured,
    pub filter: Filter,
}

impl StreamGlue<'_> {
    fn bump(&self, counter: Option<usize>) {
        if let Some(id) = counter {
            self.filter.increment_counter(id, 1);
        }
    }

    /// Counts a request decided by the failure mode after a panic.
    pub fn count_panic(&self) {
        self.bump(self.configured.counters.panics);
    }
}

/// Leases are refused at configuration (`not_yet_supported`): no reservation is ever taken.
pub enum NoReservation {}

impl Glue for StreamGlue<'_> {
    type Reservation = NoReservation;

    fn policy(&self) -> &Policy {
        &self.configured.policy
    }

    fn now_us(&self) -> u64 {
        now_us()
    }

    /// In the filter state `sluice.decision`.
    fn record(&self, decision: &[u8]) {
        self.filter.set_filter_state(DECISION_PROPERTY, decision);
    }

    fn count_outcome(&self, rule: usize, outcome: RuleOutcome, delayed: bool, local: bool) {
        let Some(stats) = self.configured.counters.rules.get(rule) else {
            return;
        };
        for stat in stat_names::outcome_stats(outcome, delayed, local) {
            self.bump(stats[stat as usize]);
        }
    }

    fn count_callout(&self, rules: impl Iterator<Item = usize>) {
        self.bump(self.configured.counters.callouts);
        for rule in rules {
            if let Some(stats) = self.configured.counters.rules.get(rule) {
                self.bump(stats[RuleStat::Callouts as usize]);
            }
        }
    }

    fn callout_failed(&self, now_us: u64, reason: &str) {
        self.bump(self.configured.counters.callout_failures);
        let due = self
            .configured
            .callout_warning
            .lock()
            .map(|mut throttle| throttle.due(now_us))
            .unwrap_or(None);
        if let Some(left_out) = due {
            let mut line = format!("sluice: {reason}; failure mode applies");
            if left_out > 0 {
                line.push_str(&format!(
                    " ({left_out} more like it since the last such line)"
                ));
            }
            log(LOG_WARN, &line);
        }
    }

    fn count_client_ip_fallback(&self) {
        self.bump(self.configured.counters.client_ip_fallbacks);
    }

    fn cache_enabled(&self) -> bool {
        self.configured.cache.enabled()
    }

    fn cache_lookup(&self, id: EntryId<'_>, now_ms: u64) -> Option<Entry> {
        self.configured.cache.lookup(id, now_ms)
    }

    fn cache_remember(&self, entry: &Entry, now_ms: u64) {
        self.configured.cache.remember(entry, now_ms);
    }

    fn take_lease(
        &self,
        _rule_index: usize,
        _rule: &Rule,
        _config: &LeaseConfig,
        _key: &LimitKey,
        _now_us: u64,
    ) -> Local<NoReservation> {
        Local::NotHeld
    }

    fn give_back(&self, reservation: &NoReservation, _now_us: u64) {
        match *reservation {}
    }
}
