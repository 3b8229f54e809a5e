//! Envoy stats through the proxy-wasm metrics ABI: per rule, and for the callouts.
//!
//! The names, and what each counts, are [`sluice_core::stat_names`]'s.
//!
//! Increments are kept here and handed to Envoy on the root context's tick, at most
//! [`FLUSH_EVERY`] apart, and when the counters are dropped or the VM is done: a host call per
//! counter per request was the largest part of the filter's host calls, and Envoy's own stats
//! sinks flush every 5 s.

use std::cell::Cell;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;
use sluice_core::record::RuleOutcome;
use sluice_core::stat_names::{self, RuleStat, rule_stat};
use sluice_core::wire::LeaseGrant;

/// How long increments may wait before Envoy sees them.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// One Envoy counter and the increments it has not been given yet.
struct Counter {
    id: u32,
    pending: Cell<u64>,
}

impl Counter {
    fn define(name: &str) -> Counter {
        Counter {
            // Envoy answers Ok for a valid type; an id of 0 only makes later increments
            // NotFound.
            id: hostcalls::define_metric(MetricType::Counter, name).unwrap_or(0),
            pending: Cell::new(0),
        }
    }

    fn bump(&self) {
        self.bump_by(1);
    }

    fn bump_by(&self, by: u64) {
        self.pending.set(self.pending.get().saturating_add(by));
    }

    fn flush(&self) {
        let by = self.pending.replace(0);
        // Errors (an unknown id) are not worth a failed request; Envoy refuses increments by
        // 0.
        if let Ok(by) = i64::try_from(by)
            && by > 0
        {
            let _ = hostcalls::increment_metric(self.id, by);
        }
    }
}

/// One rule's counters: one for each of [`RuleStat::ALL`], in its order.
struct RuleStats([Counter; RuleStat::ALL.len()]);

impl RuleStats {
    fn define(rule: &str) -> RuleStats {
        RuleStats(RuleStat::ALL.map(|stat| Counter::define(&rule_stat(rule, stat))))
    }
}

impl std::ops::Index<RuleStat> for RuleStats {
    type Output = Counter;

    fn index(&self, stat: RuleStat) -> &Counter {
        &self.0[stat as usize]
    }
}

/// Every counter the filter keeps.
pub struct Stats {
    rules: Vec<RuleStats>,
    callouts: Counter,
    callout_failures: Counter,
    lease_calls: Counter,
    lease_call_failures: Counter,
    client_ip_fallbacks: Counter,
}

impl Stats {
    /// Defines the counters for these rule names.
    pub fn define<'a>(rule_names: impl IntoIterator<Item = &'a str>) -> Stats {
        let rules = rule_names.into_iter().map(RuleStats::define).collect();
        Stats {
            rules,
            callouts: Counter::define(stat_names::CALLOUTS),
            callout_failures: Counter::define(stat_names::CALLOUT_FAILURES),
            lease_calls: Counter::define(stat_names::LEASE_CALLS),
            lease_call_failures: Counter::define(stat_names::LEASE_CALL_FAILURES),
            client_ip_fallbacks: Counter::define(stat_names::CLIENT_IP_FALLBACKS),
        }
    }

    /// Hands Envoy every increment kept so far.
    pub fn flush(&self) {
        for counter in self.rules.iter().flat_map(|r| &r.0) {
            counter.flush();
        }
        self.callouts.flush();
        self.callout_failures.flush();
        self.lease_calls.flush();
        self.lease_call_failures.flush();
        self.client_ip_fallbacks.flush();
    }

    /// Counts what happened to rule `rule` (an index into the policy's rules); `local` when
    /// it was decided here from a lease.
    pub fn outcome(&self, rule: usize, outcome: RuleOutcome, delayed: bool, local: bool) {
        let Some(s) = self.rules.get(rule) else {
            return;
        };
        for stat in stat_names::outcome_stats(outcome, delayed, local) {
            s[stat].bump();
        }
    }

    /// Counts a callout sent, carrying the checks of `rules`.
    pub fn callout(&self, rules: impl IntoIterator<Item = usize>) {
        self.callouts.bump();
        for rule in rules {
            if let Some(s) = self.rules.get(rule) {
                s[RuleStat::Callouts].bump();
            }
        }
    }

    /// Counts a callout that brought no usable answer.
    pub fn callout_failure(&self) {
        self.callout_failures.bump();
    }

    /// Counts a request keyed by its peer's address for an unreadable `x-forwarded-for` entry.
    pub fn client_ip_fallback(&self) {
        self.client_ip_fallbacks.bump();
    }

    /// Counts a lease callout sent.
    pub fn lease_call(&self) {
        self.lease_calls.bump();
    }

    /// Counts a lease callout the host refused.
    pub fn lease_failure(&self) {
        self.lease_call_failures.bump();
    }

    /// Counts one lease ask of rule `rule` and its grant (`None`: no usable answer).
    pub fn lease_answer(&self, rule: usize, grant: Option<&LeaseGrant>) {
        let Some(s) = self.rules.get(rule) else {
            return;
        };
        for (stat, by) in stat_names::lease_answer_stats(grant) {
            s[stat].bump_by(by);
        }
    }
}

impl Drop for Stats {
    /// A configuration replaced while its last requests finished still counts them.
    fn drop(&mut self) {
        self.flush();
    }
}
