//! Envoy stats through the proxy-wasm metrics ABI: per rule, and for the callouts.
//!
//! Envoy prefixes the names with `wasmcustom.`: `wasmcustom.sluice.rule.per-ip.denied`.

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;
use sluice_core::record::RuleOutcome;

/// One rule's counters.
struct RuleStats {
    allowed: u32,
    denied: u32,
    shadow_denied: u32,
    failures: u32,
    cache_hits: u32,
    shaped: u32,
}

/// Every counter the filter keeps.
pub struct Stats {
    rules: Vec<RuleStats>,
    callouts: u32,
    callout_failures: u32,
}

fn counter(name: &str) -> u32 {
    // Envoy answers Ok for a valid type; an id of 0 only makes later increments NotFound.
    hostcalls::define_metric(MetricType::Counter, name).unwrap_or(0)
}

fn bump(id: u32) {
    // Errors (an unknown id) are not worth a failed request.
    let _ = hostcalls::increment_metric(id, 1);
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
                }
            })
            .collect();
        Stats {
            rules,
            callouts: counter("sluice.callouts"),
            callout_failures: counter("sluice.callout_failures"),
        }
    }

    /// Counts what happened to rule `rule` (an index into the policy's rules).
    pub fn outcome(&self, rule: usize, outcome: RuleOutcome, delayed: bool) {
        let Some(s) = self.rules.get(rule) else {
            return;
        };
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

    /// Counts a callout sent.
    pub fn callout(&self) {
        bump(self.callouts);
    }

    /// Counts a callout that brought no usable answer.
    pub fn callout_failure(&self) {
        bump(self.callout_failures);
    }
}
