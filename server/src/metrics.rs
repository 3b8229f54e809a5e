//! The server's Prometheus metrics, served at `/metrics`.

use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use sluice_core::wire::{LeaseAsk, LeaseGrant};

use crate::label_budget::LabelBudget;
use crate::rlqs::stats::RlqsStats;
use crate::rls::stats::RlsStats;
use crate::store::StoreError;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    rule: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OverflowLabels {
    label: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    rule: String,
    kind: &'static str,
}

/// One rule's decision counters, by outcome name, as the family holds them.
type RuleCounters = Vec<(&'static str, Counter)>;

/// Every metric the server keeps.
pub struct Metrics {
    registry: Registry,
    decisions: Family<DecisionLabels, Counter>,
    /// The `decisions` counters already looked up, by rule: counting one is then a read lock
    /// and an increment, with no label set to build.
    decision_counters: RwLock<HashMap<String, RuleCounters>>,
    decision_seconds: Histogram,
    redis_errors: Family<KindLabels, Counter>,
    bad_requests: Counter,
    redis_functions: Gauge,
    redis_clock_uncertainty: Gauge<f64, AtomicU64>,
    split_decision_races: Counter,
    tls_handshake_failures: Counter,
    busy_poll_seconds: Counter<f64, AtomicU64>,
    lease_answers: Family<LeaseLabels, Counter>,
    lease_units: Family<LeaseLabels, Counter>,
    lease_strangers: Counter,
    /// Rule names come from requests: bounded, as [`crate::label_budget`] says.
    decision_rules: LabelBudget,
    lease_rules: LabelBudget,
    rls: RlsStats,
    rlqs: RlqsStats,
}

impl Default for Metrics {
    fn default() -> Metrics {
        let mut registry = Registry::with_prefix("sluice");
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "decisions",
            "Checks decided, by rule and outcome (allowed, denied, shadow_denied, skipped)",
            decisions.clone(),
        );
        // 50 us to ~1.6 s.
        let decision_seconds = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        registry.register(
            "decision_duration_seconds",
            "Time to decide one request (all its checks), Redis included",
            decision_seconds.clone(),
        );
        let redis_errors = Family::<KindLabels, Counter>::default();
        registry.register(
            "redis_errors",
            "Failed Redis calls, by kind (error, timeout, not_connected, bad_reply, cluster_node, replica)",
            redis_errors.clone(),
        );
        let bad_requests = Counter::default();
        registry.register(
            "bad_requests",
            "Requests refused with 4xx",
            bad_requests.clone(),
        );
        let redis_functions = Gauge::default();
        registry.register(
            "redis_functions",
            "1 while scripts are called as Redis Functions (FCALL), 0 when by EVALSHA \
             (--redis-scripts eval, or a Redis without Functions or whose ACL refuses them)",
            redis_functions.clone(),
        );
        let redis_clock_uncertainty = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "redis_clock_uncertainty_seconds",
            "How far the time scripts are given may be from Redis' clock: half the round trip \
             of the TIME read the server carries, plus 100 ppm of drift since; 0 while scripts \
             read TIME themselves",
            redis_clock_uncertainty.clone(),
        );
        let split_decision_races = Counter::default();
        registry.register(
            "split_decision_races",
            "Cluster decisions denied in their second phase although the first found room: \
             another request took the last units in between, and the request's other checks \
             consumed (see docs/algorithms.md)",
            split_decision_races.clone(),
        );
        let tls_handshake_failures = Counter::default();
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes on the listeners that failed or timed out: a client without the \
             certificate required, or one refusing the server's, or not speaking TLS",
            tls_handshake_failures.clone(),
        );
        let busy_poll_seconds = Counter::<f64, AtomicU64>::default();
        registry.register(
            "busy_poll_seconds",
            "Time the server's thread spent in runs of busy polling (--busy-poll-us), working \
             or polling for the next event but never asleep",
            busy_poll_seconds.clone(),
        );
        let lease_answers = Family::<LeaseLabels, Counter>::default();
        registry.register(
            "lease_answers",
            "Lease asks answered, by rule and kind (granted: some units; empty: the algorithm \
             admits nothing now; capped: held back by max_units or max_outstanding; report: \
             nothing asked)",
            lease_answers.clone(),
        );
        let lease_units = Family::<LeaseLabels, Counter>::default();
        registry.register(
            "lease_units",
            "Units leased to Envoys, given back by them, and lapsed (an Envoy renewed units whose lease had already ended), by rule and kind (granted, returned, lapsed)",
            lease_units.clone(),
        );
        let lease_strangers = Counter::default();
        registry.register(
            "lease_strangers",
            "Lease requests refused (409) because an ask named a holder whose ledger entry \
             another secret bound: a caller using another Envoy's holder name",
            lease_strangers.clone(),
        );
        let label_overflow = Family::<OverflowLabels, Counter>::default();
        registry.register(
            "label_overflow",
            "Values counted under `_overflow` because their label already had 1,000 distinct \
             values (rule names and stats keys come from requests), by label (decision_rule, \
             lease_rule, stats_key)",
            label_overflow.clone(),
        );
        let budget = |label: &'static str| {
            LabelBudget::new(
                label_overflow
                    .get_or_create(&OverflowLabels { label })
                    .clone(),
            )
        };
        Metrics {
            decision_rules: budget("decision_rule"),
            lease_rules: budget("lease_rule"),
            rls: RlsStats::new(budget("stats_key")),
            rlqs: RlqsStats::default(),
            registry,
            split_decision_races,
            tls_handshake_failures,
            busy_poll_seconds,
            lease_answers,
            lease_units,
            lease_strangers,
            decisions,
            decision_counters: RwLock::default(),
            decision_seconds,
            redis_errors,
            bad_requests,
            redis_functions,
            redis_clock_uncertainty,
        }
    }
}

impl Metrics {
    /// Counts one check's outcome.
    pub fn decision(&self, rule: &str, outcome: &'static str) {
        // A poisoned lock only means a panic elsewhere mid-insert; the map is still sound.
        let counters = self
            .decision_counters
            .read()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((_, counter)) = counters
            .get(rule)
            .and_then(|by_outcome| by_outcome.iter().find(|(o, _)| *o == outcome))
        {
            counter.inc();
            return;
        }
        drop(counters);
        let label = self.decision_rules.label(rule);
        let counter = self
            .decisions
            .get_or_create(&DecisionLabels {
                rule: label.as_ref().to_owned(),
                outcome,
            })
            .clone();
        counter.inc();
        // Only names the budget took are remembered, so the lookup map is bounded too.
        if label != rule {
            return;
        }
        let mut counters = self
            .decision_counters
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let by_outcome = counters.entry(rule.to_owned()).or_default();
        if !by_outcome.iter().any(|(o, _)| *o == outcome) {
            by_outcome.push((outcome, counter));
        }
    }

    /// Records how long a request took.
    pub fn decision_time(&self, elapsed: Duration) {
        self.decision_seconds.observe(elapsed.as_secs_f64());
    }

    /// Counts a failed Redis call.
    pub fn redis_error(&self, error: &StoreError) {
        self.redis_errors
            .get_or_create(&KindLabels { kind: error.kind() })
            .inc();
    }

    /// Counts a Cluster decision whose second phase found a key taken since the first.
    pub fn split_decision_race(&self) {
        self.split_decision_races.inc();
    }

    /// Counts a failed TLS handshake on a listener.
    pub fn tls_handshake_failed(&self) {
        self.tls_handshake_failures.inc();
    }

    /// Counts time spent busy polling.
    pub fn busy_polled(&self, spent: Duration) {
        self.busy_poll_seconds.inc_by(spent.as_secs_f64());
    }

    /// Counts one lease ask and what it was granted.
    pub fn lease(&self, ask: &LeaseAsk, grant: &LeaseGrant) {
        let kind = if grant.granted > 0 {
            "granted"
        } else if ask.want == 0 {
            "report"
        } else if grant.more_in_ms > 0 {
            "empty"
        } else {
            "capped"
        };
        let rule = self.lease_rules.label(ask.rule.as_str()).into_owned();
        let labels = |kind: &'static str| LeaseLabels {
            rule: rule.clone(),
            kind,
        };
        self.lease_answers.get_or_create(&labels(kind)).inc();
        if grant.granted > 0 {
            self.lease_units
                .get_or_create(&labels("granted"))
                .inc_by(grant.granted);
        }
        if ask.returning > 0 {
            self.lease_units
                .get_or_create(&labels("returned"))
                .inc_by(ask.returning);
        }
        if let Some(kept) = grant.kept {
            self.lease_units
                .get_or_create(&labels("lapsed"))
                .inc_by(ask.held.saturating_sub(kept));
        }
    }

    /// Counts a lease request refused for naming another secret's holder.
    pub fn lease_stranger(&self) {
        self.lease_strangers.inc();
    }

    /// Counts a refused request.
    pub fn bad_request(&self) {
        self.bad_requests.inc();
    }

    /// Says whether scripts are called as Redis Functions now.
    pub fn set_redis_functions(&self, functions: bool) {
        self.redis_functions.set(i64::from(functions));
    }

    /// Says how far the time scripts are given may be from Redis' clock, in microseconds.
    pub fn set_redis_clock_uncertainty(&self, us: i64) {
        self.redis_clock_uncertainty.set(us as f64 / 1e6);
    }

    /// The rate limit service's stats, under the reference service's names.
    pub fn rls(&self) -> &RlsStats {
        &self.rls
    }

    /// The quota service's metrics.
    pub fn rlqs(&self) -> &RlqsStats {
        &self.rlqs
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode_registry(&mut text, &self.registry);
        let _ = encode_registry(&mut text, self.rls.registry());
        let _ = encode_registry(&mut text, self.rlqs.registry());
        let _ = encode_eof(&mut text);
        text
    }
}
