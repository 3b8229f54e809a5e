//! The reference service's stats, under the names its Prometheus users query: what
//! envoyproxy/ratelimit's statsd mapping (`src/stats/prom/default_mapper.yaml`) makes of
//! `ratelimit.service.rate_limit.<domain>.<key1>.<key2>...<stat>`, for example
//! `ratelimit_service_rate_limit_over_limit{domain="shop",key1="remote_address",key2=""}`.
//!
//! Those names carry no `_total` suffix, which OpenMetrics requires of a counter, so they are
//! exposed as metrics of unknown type: Prometheus stores them under exactly these names, and
//! `rate()` works on them as on any counter.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use crate::label_budget::LabelBudget;
use crate::label_budget::add_saturating;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use regex::Regex;
use sluice_core::rls::answer::HitCounts;

/// A counter exposed under its name as given (see the module's documentation).
#[derive(Debug, Clone, Default)]
struct ReferenceCounter(Counter);

impl TypedMetric for ReferenceCounter {
    const TYPE: MetricType = MetricType::Unknown;
}

impl EncodeMetric for ReferenceCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.0.get())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Unknown
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KeyLabels {
    domain: String,
    key1: String,
    key2: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    err_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    grpc_method: &'static str,
}

type ByKey = Family<KeyLabels, ReferenceCounter>;

/// Every stat the reference service keeps that sluice keeps too.
#[derive(Debug)]
pub struct RlsStats {
    registry: Registry,
    total_hits: ByKey,
    over_limit: ByKey,
    near_limit: ByKey,
    within_limit: ByKey,
    shadow_mode: ByKey,
    over_limit_with_local_cache: ByKey,
    errors: Family<ErrorLabels, ReferenceCounter>,
    total_requests: Family<MethodLabels, ReferenceCounter>,
    response_time: Family<MethodLabels, Histogram>,
    config_load_success: ReferenceCounter,
    config_load_error: ReferenceCounter,
    /// Stats keys come from requests (a descriptor's value, with `detailed_metric` or an
    /// override): bounded.
    stats_keys: LabelBudget,
    /// By label (a stats key, or the overflow key): its labels and counters.
    by_label: RwLock<HashMap<String, Arc<KeyCounters>>>,
    /// `ShouldRateLimit`'s request counter and histogram, once it has been called.
    should_rate_limit: OnceLock<(ReferenceCounter, Histogram)>,
}

/// One stats key's labels and its counters in each by-key family, each made when first
/// counted (the reference service shows a stat once it has counted something).
#[derive(Debug)]
struct KeyCounters {
    labels: KeyLabels,
    stats: [OnceLock<ReferenceCounter>; 6],
}

/// Why a call failed, as the reference names it (`err_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallError {
    /// Redis did not answer.
    Redis,
    /// The request could not be decided (no domain, no descriptors, a bad override).
    Service,
}

impl Default for RlsStats {
    fn default() -> RlsStats {
        RlsStats::new(LabelBudget::new(Counter::default()))
    }
}

impl RlsStats {
    /// The stats, their keys held to `stats_keys`.
    pub fn new(stats_keys: LabelBudget) -> RlsStats {
        let mut registry = Registry::default();
        let mut by_key = |stat: &str, help: &str| {
            let family = ByKey::default();
            registry.register(
                format!("ratelimit_service_rate_limit_{stat}"),
                help,
                family.clone(),
            );
            family
        };
        let total_hits = by_key("total_hits", "Hits of each descriptor's limit");
        let over_limit = by_key("over_limit", "Hits over the limit");
        let near_limit = by_key("near_limit", "Hits within the limit past 80 % of it");
        let within_limit = by_key("within_limit", "Hits within the limit");
        let shadow_mode = by_key(
            "shadow_mode",
            "Over-limit hits a shadow-mode limit let pass",
        );
        let over_limit_with_local_cache = by_key(
            "over_limit_with_local_cache",
            "Over-limit hits answered from the local cache, without Redis",
        );
        let errors = Family::<ErrorLabels, ReferenceCounter>::default();
        registry.register(
            "ratelimit_service_should_rate_limit_error",
            "ShouldRateLimit calls that failed, by err_type (redis_error, service_error)",
            errors.clone(),
        );
        let total_requests = Family::<MethodLabels, ReferenceCounter>::default();
        registry.register(
            "ratelimit_service_total_requests",
            "gRPC calls, by method",
            total_requests.clone(),
        );
        let response_time = Family::<MethodLabels, Histogram>::new_with_constructor(|| {
            // 50 µs to ~1.6 s, as sluice_decision_duration_seconds.
            Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
        });
        registry.register(
            "ratelimit_service_response_time_seconds",
            "Time to answer a gRPC call, by method",
            response_time.clone(),
        );
        let config_load_success = ReferenceCounter::default();
        registry.register(
            "ratelimit_service_config_load_success",
            "Configurations loaded",
            config_load_success.clone(),
        );
        let config_load_error = ReferenceCounter::default();
        registry.register(
            "ratelimit_service_config_load_error",
            "Configurations that failed to load (the previous one stayed in force)",
            config_load_error.clone(),
        );
        RlsStats {
            registry,
            total_hits,
            over_limit,
            near_limit,
            within_limit,
            shadow_mode,
            over_limit_with_local_cache,
            errors,
            total_requests,
            response_time,
            config_load_success,
            config_load_error,
            stats_keys,
            by_label: RwLock::default(),
            should_rate_limit: OnceLock::new(),
        }
    }

    /// Counts one descriptor's hits under its stats key (`domain.key_value...`), or under
    /// the overflow key once the stats have [`crate::label_budget::MAX_VALUES`] keys.
    pub fn hits(&self, stats_key: &str, counts: &HitCounts) {
        let label = self.stats_keys.label(stats_key);
        let counters = self.counters_of(&label);
        for (i, n) in [
            counts.total_hits,
            counts.over_limit,
            counts.near_limit,
            counts.within_limit,
            counts.shadow_mode,
            counts.over_limit_with_local_cache,
        ]
        .into_iter()
        .enumerate()
        {
            if n > 0 {
                let family = self.by_key_families()[i];
                let counter = counters.stats[i]
                    .get_or_init(|| family.get_or_create(&counters.labels).clone());
                add_saturating(&counter.0, n);
            }
        }
    }

    fn by_key_families(&self) -> [&ByKey; 6] {
        [
            &self.total_hits,
            &self.over_limit,
            &self.near_limit,
            &self.within_limit,
            &self.shadow_mode,
            &self.over_limit_with_local_cache,
        ]
    }

    /// The counters of a stats key's labels: made once per key (at most the label budget's
    /// keys and the overflow key), since the labels take a regex and three strings to make
    /// and every `ShouldRateLimit` counts each of its descriptors.
    fn counters_of(&self, label: &str) -> Arc<KeyCounters> {
        if let Some(counters) = self
            .by_label
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(label)
        {
            return Arc::clone(counters);
        }
        let counters = Arc::new(KeyCounters {
            labels: labels(label),
            stats: Default::default(),
        });
        self.by_label
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(label.to_owned())
            .or_insert(counters)
            .clone()
    }

    /// Counts one `ShouldRateLimit` call and its time.
    pub fn call(&self, elapsed: Duration) {
        let (requests, time) = self.should_rate_limit.get_or_init(|| {
            let labels = MethodLabels {
                grpc_method: "ShouldRateLimit",
            };
            (
                self.total_requests.get_or_create(&labels).clone(),
                self.response_time.get_or_create(&labels).clone(),
            )
        });
        requests.0.inc();
        time.observe(elapsed.as_secs_f64());
    }

    /// Counts a failed `ShouldRateLimit`.
    pub fn error(&self, error: CallError) {
        let err_type = match error {
            CallError::Redis => "redis_error",
            CallError::Service => "service_error",
        };
        self.errors.get_or_create(&ErrorLabels { err_type }).0.inc();
    }

    /// Counts a configuration load.
    pub fn config_load(&self, succeeded: bool) {
        if succeeded {
            self.config_load_success.0.inc();
        } else {
            self.config_load_error.0.inc();
        }
    }

    /// The registry, to render beside the server's own.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}

/// The statsd mapping's labels of a stats key: the reference's stat name sanitised (`:` and
/// `|` become `_`, as do the dots of an IPv4 address), split at its dots.
fn labels(stats_key: &str) -> KeyLabels {
    static IPV4: LazyLock<Option<Regex>> =
        LazyLock::new(|| Regex::new(r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}").ok());
    let replaced = stats_key.replace([':', '|'], "_");
    let sanitized = match IPV4.as_ref() {
        Some(ipv4) => ipv4
            .replace_all(&replaced, |c: &regex::Captures<'_>| c[0].replace('.', "_"))
            .into_owned(),
        None => replaced,
    };
    let mut parts = sanitized.split('.');
    let mut next = || parts.next().unwrap_or_default().to_owned();
    KeyLabels {
        domain: next(),
        key1: next(),
        key2: next(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stats_key_gets_the_labels_the_reference_s_statsd_mapping_gives_it() {
        let l = labels("edge_proxy_per_ip.remote_address_10.0.0.1");
        assert_eq!(
            (l.domain.as_str(), l.key1.as_str(), l.key2.as_str()),
            ("edge_proxy_per_ip", "remote_address_10_0_0_1", "")
        );
        let l = labels("messaging.message_type_marketing.to_number.extra");
        assert_eq!(
            (l.key1.as_str(), l.key2.as_str()),
            ("message_type_marketing", "to_number")
        );
    }

    #[test]
    fn the_counters_are_exposed_under_the_reference_s_names_without_a_suffix() {
        let stats = RlsStats::default();
        stats.hits(
            "shop.remote_address",
            &HitCounts {
                total_hits: 3,
                over_limit: 1,
                within_limit: 2,
                ..HitCounts::default()
            },
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, stats.registry()).unwrap();
        assert!(
            text.contains(
                "ratelimit_service_rate_limit_total_hits{domain=\"shop\",key1=\"remote_address\",key2=\"\"} 3"
            ),
            "{text}"
        );
        assert!(
            text.contains("ratelimit_service_rate_limit_over_limit{"),
            "{text}"
        );
        assert!(!text.contains("_total_hits_total"), "{text}");
    }
}
