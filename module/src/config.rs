//! One filter configuration in Envoy: the policy, the deny cache, the leases and the counters
//! every worker's streams share, with the leases' tick and calls on the main thread; and, for
//! one stream, the requests' [`Glue`].

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sluice_core::deny_cache::{Entry, EntryId, fingerprint};
use sluice_core::key::LimitKey;
use sluice_core::lease::LeaseConfig;
use sluice_core::policy::{Policy, PolicyError, Rule};
use sluice_core::record::{DECISION_PROPERTY, RuleOutcome};
use sluice_core::stat_names::{self, RuleStat, rule_stat};
use sluice_core::throttle::Throttle;
use sluice_core::wire::LEASE_PATH;
use sluice_filter_logic::answer::refused;
use sluice_filter_logic::lease::Reservation;
use sluice_filter_logic::{Glue, Local, callout_headers};

use crate::abi::LOG_WARN;
use crate::cache::DenyCache;
use crate::clock::now_us;
use crate::envoy::{Config, Filter, log};
use crate::lease::ModuleLeases;

/// A validated configuration, shared by every worker (Envoy creates it on the main thread).
pub struct Configured {
    pub policy: Policy,
    /// This configuration's id among every one the process has made, from 1: what a
    /// worker's repeatable decisions are kept under (see [`sluice_filter_logic::Repeats`]),
    /// where an address could be a new configuration's in a freed one's place.
    pub id: u64,
    pub cache: DenyCache,
    /// Whether Envoy has let go of the configuration (`config_destroy`): the streams kept for
    /// the next requests then let go of it too ([`crate::spares`]).
    retired: AtomicBool,
    /// The leased rules' allowances; `None` when no rule leases.
    leases: Option<ModuleLeases>,
    counters: Counters,
    /// When the callout-failure warning is next due: at most one a second for the whole
    /// Envoy, saying how many were left out.
    callout_warning: Mutex<Throttle>,
    /// The same for failed lease calls.
    lease_warning: Mutex<Throttle>,
}

/// The Envoy counters' ids, defined with the configuration.
struct Counters {
    callouts: Option<usize>,
    callout_failures: Option<usize>,
    client_ip_fallbacks: Option<usize>,
    panics: Option<usize>,
    lease_calls: Option<usize>,
    lease_call_failures: Option<usize>,
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
        let rules = policy
            .rules
            .iter()
            .map(|rule| {
                RuleStat::ALL
                    .map(|stat| config.define_counter(&rule_stat(rule.name.as_str(), stat)))
            })
            .collect();
        let leases = policy
            .rules
            .iter()
            .any(|r| r.lease.is_some())
            .then(|| ModuleLeases::new(config.0, fingerprint(json), &policy.rules));
        static MADE: AtomicU64 = AtomicU64::new(0);
        Ok(Configured {
            id: MADE.fetch_add(1, Ordering::Relaxed) + 1,
            cache: DenyCache::new(policy.deny_cache_slots),
            retired: AtomicBool::new(false),
            leases,
            counters: Counters {
                callouts: config.define_counter(stat_names::CALLOUTS),
                callout_failures: config.define_counter(stat_names::CALLOUT_FAILURES),
                client_ip_fallbacks: config.define_counter(stat_names::CLIENT_IP_FALLBACKS),
                panics: config.define_counter(stat_names::PANICS),
                lease_calls: config.define_counter(stat_names::LEASE_CALLS),
                lease_call_failures: config.define_counter(stat_names::LEASE_CALL_FAILURES),
                rules,
            },
            policy,
            callout_warning: Mutex::new(Throttle::new(WARN_EVERY_US)),
            lease_warning: Mutex::new(Throttle::new(WARN_EVERY_US)),
        })
    }

    /// The leases' tick, on the main thread: sends what they have to say as one lease call.
    pub fn on_lease_tick(&self, config: &Config) {
        let Some(leases) = &self.leases else {
            return;
        };
        leases.ticked();
        let Some((request, sent)) = leases.lock().on_tick(&self.policy.rules, now_us()) else {
            return;
        };
        let service = &self.policy.service;
        let body = request.to_json();
        let headers = callout_headers(service, LEASE_PATH);
        match config.post(
            &service.cluster,
            headers,
            &body,
            service.timeout.as_millis(),
        ) {
            Ok(id) => {
                bump(config, self.counters.lease_calls, 1);
                leases.lock().sent(id, sent);
                leases.call_sent(id, request);
            }
            Err(refused) => {
                warn(&self.lease_warning, || {
                    format!(
                        "sluice: the lease call to cluster `{}` was not sent: {refused}",
                        service.cluster
                    )
                });
                bump(config, self.counters.lease_call_failures, 1);
                leases.lock().not_sent(sent);
            }
        }
    }

    /// The answer to lease call `id`: `status` and `body`, or `None` for a call that failed.
    pub fn on_lease_answer(&self, config: &Config, id: u64, answer: Option<(&[u8], &[u8])>) {
        let Some(leases) = &self.leases else {
            return;
        };
        let Some(request) = leases.call_answered(id) else {
            return;
        };
        let grants = match answer {
            None => Err("the callout was reset".to_owned()),
            Some((status, body)) => sluice_filter_logic::lease::grants(&request, body)
                .map_err(|reason| refused(status, body, reason)),
        };
        if let Err(reason) = &grants {
            warn(&self.lease_warning, || {
                format!("sluice: lease call failed: {reason}; leases run on what they hold")
            });
        }
        leases.lock().answered(id, grants, |rule, grant| {
            let Some(stats) = self.counters.rules.get(rule) else {
                return;
            };
            for (stat, by) in stat_names::lease_answer_stats(grant) {
                bump(config, stats[stat as usize], by);
            }
        });
    }

    /// The configuration is going away: its leases' tick stops, and every worker lets go of
    /// the streams it kept that hold it.
    pub fn stop(&self) {
        if let Some(leases) = &self.leases {
            leases.stop();
        }
        self.retired.store(true, Ordering::Release);
        RETIRED.fetch_add(1, Ordering::Release);
    }

    /// Whether Envoy has let go of the configuration.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }
}

/// How many configurations Envoy has let go of, since the module was loaded.
static RETIRED: AtomicU64 = AtomicU64::new(0);

/// How many configurations Envoy has let go of: when it moves, a worker looks for the streams
/// it kept that hold one.
pub fn retirements() -> u64 {
    RETIRED.load(Ordering::Acquire)
}

/// Adds `by` to `counter` from the main thread.
fn bump(config: &Config, counter: Option<usize>, by: u64) {
    if let Some(id) = counter {
        config.increment_counter(id, by);
    }
}

/// Writes the warning `line` makes, if `throttle` says one is due, with how many were left
/// out since the last.
fn warn(throttle: &Mutex<Throttle>, line: impl FnOnce() -> String) {
    let due = throttle
        .lock()
        .map(|mut throttle| throttle.due(now_us()))
        .unwrap_or(None);
    if let Some(left_out) = due {
        let mut line = line();
        if left_out > 0 {
            line.push_str(&format!(
                " ({left_out} more like it since the last such line)"
            ));
        }
        log(LOG_WARN, &line);
    }
}

fn invalid(e: &PolicyError) -> String {
    format!("sluice: invalid configuration: {e}")
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

impl Glue for StreamGlue<'_> {
    type Reservation = Reservation;

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

    fn callout_failed(&self, _now_us: u64, reason: &str) {
        self.bump(self.configured.counters.callout_failures);
        warn(&self.configured.callout_warning, || {
            format!("sluice: {reason}; failure mode applies")
        });
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
        rule_index: usize,
        rule: &Rule,
        config: &LeaseConfig,
        key: &LimitKey,
        now_us: u64,
    ) -> Local<Reservation> {
        match &self.configured.leases {
            Some(leases) => leases.lock().take(rule_index, rule, config, key, now_us),
            None => Local::NotHeld,
        }
    }

    fn give_back(&self, reservation: &Reservation, rule_index: usize, key: &LimitKey, now_us: u64) {
        if let Some(leases) = &self.configured.leases {
            leases
                .lock()
                .give_back(reservation, rule_index, key, now_us);
        }
    }
}
