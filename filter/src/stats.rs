//! Envoy stats through the proxy-wasm metrics ABI: per rule, and for the callouts.
//!
//! Envoy prefixes the names with `wasmcustom.`: `wasmcustom.sluice.rule.per-ip.denied`.
//! Per rule: `allowed`, `denied`, `shadow_denied`, `failures`, `cache_hits`, `shaped`,
//! `callouts` (requests whose check for the rule went to sluice-server), and for
//! leased rules `local` (decided here from a lease, also counted as allowed or denied),
//! `lease_asks` (asks answered), `lease_units` (units granted), `lease_empty` (answers with
//! nothing to lease), `lease_failures` (asks that got no answer). Globally: `callouts`,
//! `callout_failures`, `lease_calls`, `lease_call_failures`.

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;
use sluice_core::record::RuleOutcome;
use sluice_core::wire::LeaseGrant;

/// One rule's counters.
struct RuleStats {
    allowed: u32,
    denied: u32,
    shadow_denied: u32,
    failures: u32,
    cache_hits: u32,
    shaped: u32,
    callouts: u32,
    local: u32,
    lease_asks: u32,
    lease_units: u32,
    lease_empty: u32,
    lease_failures: u32,
}

/// Every counter the filter keeps.
pub struct Stats {
    rules: Vec<RuleStats>,
    callouts: u32,
    callout_failures: u32,
    lease_calls: u32,
    lease_call_failures: u32,
}

fn counter(name: &str) -> u32 {
    // Envoy answers Ok for a valid type; an id of 0 only makes later increments NotFound.
    hostcalls::define_metric(MetricType::Counter, name).unwrap_or(0)
}

fn bump(id: u32) {
    bump_by(id, 1);
}

fn bump_by(id: u32, by: u64) {
    // Errors (an unknown id) are not worth a failed request; Envoy refuses increments by 0.
    if let Ok(by) = i64::try_from(by)
        && by > 0
    {
        let _ = hostcalls::increment_metric(id, by);
    }
}

impl Stats {
    /// Defines the counters for these rule names.
    pub fn define<'a>(rule_names: impl IntoIterator<Item = &'a str>) -> Stats {
        let rules = rule_names
            .into_iter()
            .map(|rule| {
                let name = |stat: &str| counter(&format!("sluice.rule.{rule}.{stat}"));
                RuleStats {
                    allowed: name("allowed"),
                    denied: name("denied"),
                    shadow_denied: name("shadow_denied"),
                    failures: name("failures"),
                    cache_hits: name("cache_hits"),
                    shaped: name("shaped"),
                    callouts: name("callouts"),
                    local: name("local"),
                    lease_asks: name("lease_asks"),
                    lease_units: name("lease_units"),
                    lease_empty: name("lease_empty"),
                    lease_failures: name("lease_failures"),
                }
            })
            .collect();
        Stats {
            rules,
            callouts: counter("sluice.callouts"),
            callout_failures: counter("sluice.callout_failures"),
            lease_calls: counter("sluice.lease_calls"),
            lease_call_failures: counter("sluice.lease_call_failures"),
        }
    }

    /// Counts what happened to rule `rule` (an index into the policy's rules); `local` when
    /// it was decided here from a lease.
    pub fn outcome(&self, rule: usize, outcome: RuleOutcome, delayed: bool, local: bool) {
        let Some(s) = self.rules.get(rule) else {
            return;
        };
        if local && outcome != RuleOutcome::Skipped {
            bump(s.local);
        }
        match outcome {
            RuleOutcome::Allowed => bump(s.allowed),
            RuleOutcome::Denied => bump(s.denied),
            RuleOutcome::ShadowDenied => bump(s.shadow_denied),
            RuleOutcome::CachedDeny => bump(s.cache_hits),
            RuleOutcome::Failed => bump(s.failures),
            RuleOutcome::Skipped => {}
        }
        if delayed {
            bump(s.shaped);
        }
    }

    /// Counts a callout sent, carrying the checks of `rules`.
    pub fn callout(&self, rules: impl IntoIterator<Item = usize>) {
        bump(self.callouts);
        for rule in rules {
            if let Some(s) = self.rules.get(rule) {
                bump(s.callouts);
            }
        }
    }

    /// Counts a callout that brought no usable answer.
    pub fn callout_failure(&self) {
        bump(self.callout_failures);
    }

    /// Counts a lease callout sent.
    pub fn lease_call(&self) {
        bump(self.lease_calls);
    }

    /// Counts a lease callout the host refused.
    pub fn lease_failure(&self) {
        bump(self.lease_call_failures);
    }

    /// Counts one lease ask of rule `rule` and its grant (`None`: no usable answer).
    pub fn lease_answer(&self, rule: usize, grant: Option<&LeaseGrant>) {
        let Some(s) = self.rules.get(rule) else {
            return;
        };
        match grant {
            None => bump(s.lease_failures),
            Some(grant) => {
                bump(s.lease_asks);
                bump_by(s.lease_units, grant.granted);
                if grant.granted == 0 && grant.more_in_ms > 0 {
                    bump(s.lease_empty);
                }
            }
        }
    }
}
