//! The quota service's metrics. Labels are domains and rule names from `--rlqs-config`, never
//! bucket ids, so their number is what the configuration names: a per-client rule is one
//! label however many clients it covers.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sluice_core::rlqs::bucket::Assignment;

use crate::label_budget::add_saturating;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    domain: String,
    rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    domain: String,
    rule: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// Every metric of the quota service.
pub struct RlqsStats {
    registry: Registry,
    streams: Gauge,
    buckets: Gauge,
    reports: Counter,
    refused: Counter,
    requests: Family<OutcomeLabels, Counter>,
    assigned_rate: Family<RuleLabels, Gauge<f64, AtomicU64>>,
    assignments: Family<KindLabels, Counter>,
    funding_failures: Counter,
    refused_buckets: Family<CapLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CapLabels {
    cap: &'static str,
}

impl Default for RlqsStats {
    fn default() -> RlqsStats {
        let mut registry = Registry::with_prefix("sluice_rlqs");
        let streams = Gauge::default();
        registry.register(
            "streams",
            "Quota streams open: one an Envoy",
            streams.clone(),
        );
        let buckets = Gauge::default();
        registry.register(
            "buckets",
            "Buckets the open streams report, counted once a stream",
            buckets.clone(),
        );
        let reports = Counter::default();
        registry.register("reports", "Usage reports taken in", reports.clone());
        let refused = Counter::default();
        registry.register(
            "refused_reports",
            "Usage reports refused (a malformed message, or a domain not configured); each ends its stream with InvalidArgument",
            refused.clone(),
        );
        let requests = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "requests",
            "Requests the Envoys reported, by domain, rule and outcome (allowed, denied)",
            requests.clone(),
        );
        let assigned_rate = Family::<RuleLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "assigned_rate",
            "Requests a second the token buckets last assigned refill, summed over this server's streams, by domain and rule",
            assigned_rate.clone(),
        );
        let assignments = Family::<KindLabels, Counter>::default();
        registry.register(
            "assignments",
            "Bucket actions sent, by kind (token_bucket, allow_all, deny_all, abandon)",
            assignments.clone(),
        );
        let funding_failures = Counter::default();
        registry.register(
            "funding_failures",
            "Fundings of a stream's buckets that Redis did not answer: the Envoy keeps its last assignments until they lapse",
            funding_failures.clone(),
        );
        let refused_buckets = Family::<CapLabels, Counter>::default();
        registry.register(
            "refused_buckets",
            "New buckets given no assignment because a cap was reached, by cap (stream_cap: --rlqs-max-buckets-per-stream, server_cap: --rlqs-max-buckets, holder_cap: --rlqs-max-holders-per-bucket, counted at each funding refused)",
            refused_buckets.clone(),
        );
        RlqsStats {
            refused_buckets,
            registry,
            streams,
            buckets,
            reports,
            refused,
            requests,
            assigned_rate,
            assignments,
            funding_failures,
        }
    }
}

impl RlqsStats {
    /// Counts a stream opened (`open`) or closed.
    pub fn stream(&self, open: bool) {
        if open {
            self.streams.inc();
        } else {
            self.streams.dec();
        }
    }

    /// Counts `n` buckets more (or fewer).
    pub fn buckets(&self, n: i64) {
        self.buckets.inc_by(n);
    }

    /// Counts a report taken in.
    pub fn report(&self) {
        self.reports.inc();
    }

    /// Counts a report refused.
    pub fn refused(&self) {
        self.refused.inc();
    }

    /// Counts what one bucket's usage reported.
    pub fn usage(&self, domain: &str, rule: &str, allowed: u64, denied: u64) {
        for (outcome, n) in [("allowed", allowed), ("denied", denied)] {
            if n > 0 {
                let labels = OutcomeLabels {
                    domain: domain.to_owned(),
                    rule: rule.to_owned(),
                    outcome,
                };
                add_saturating(&self.requests.get_or_create(&labels), n);
            }
        }
    }

    /// Counts an assignment sent for a bucket of `rule` that replaced `before`.
    pub fn assigned(
        &self,
        domain: &str,
        rule: &str,
        assignment: &Assignment,
        before: Option<Assignment>,
    ) {
        self.assignments
            .get_or_create(&KindLabels {
                kind: assignment.kind(),
            })
            .inc();
        self.rate_moved(domain, rule, before, Some(*assignment));
    }

    /// Counts a bucket abandoned, or forgotten with its stream, that had `before`.
    pub fn forgotten(&self, domain: &str, rule: &str, before: Option<Assignment>, abandoned: bool) {
        if abandoned {
            self.assignments
                .get_or_create(&KindLabels { kind: "abandon" })
                .inc();
        }
        self.rate_moved(domain, rule, before, None);
    }

    fn rate_moved(
        &self,
        domain: &str,
        rule: &str,
        before: Option<Assignment>,
        after: Option<Assignment>,
    ) {
        let rate = |a: Option<Assignment>| a.and_then(|a| a.rate_per_s()).unwrap_or(0.0);
        let delta = rate(after) - rate(before);
        if delta != 0.0 {
            let labels = RuleLabels {
                domain: domain.to_owned(),
                rule: rule.to_owned(),
            };
            self.assigned_rate.get_or_create(&labels).inc_by(delta);
        }
    }

    /// Counts a new bucket refused for `cap`.
    pub fn bucket_refused(&self, cap: &'static str) {
        self.refused_buckets.get_or_create(&CapLabels { cap }).inc();
    }

    /// Counts a funding Redis did not answer.
    pub fn funding_failed(&self) {
        self.funding_failures.inc();
    }

    /// The registry, for `/metrics`.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}
