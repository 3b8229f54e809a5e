//! The Envoy process's metrics, which every VM defines and updates.

use std::collections::BTreeMap;
use std::sync::Mutex;

// Looked up by every host call: a fast hash, not a DoS-resistant one (no key here is chosen
// by a client).
use rustc_hash::FxHashMap as HashMap;

/// The kind of a metric (its id's low two bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MetricKind {
    /// Only goes up.
    Counter = 0,
    /// Goes up and down.
    Gauge = 1,
    /// Records samples.
    Histogram = 2,
}

/// A metric's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricValue {
    /// A counter or gauge.
    Number(i64),
    /// A histogram's samples.
    Samples(Vec<u64>),
}

/// The stats of one Envoy process, by name.
#[derive(Default)]
pub struct MetricRegistry {
    values: Mutex<BTreeMap<(String, MetricKind), MetricValue>>,
}

impl MetricRegistry {
    /// Every metric, with Envoy's `wasmcustom.` prefix, in name order.
    pub fn snapshot(&self) -> Vec<(String, MetricKind, MetricValue)> {
        let values = self
            .values
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        values
            .iter()
            .map(|((name, kind), v)| (format!("wasmcustom.{name}"), *kind, v.clone()))
            .collect()
    }

    /// A counter's or gauge's value, by name without the prefix.
    pub fn number(&self, name: &str) -> Option<i64> {
        let values = self
            .values
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        values.iter().find_map(|((n, _), v)| match v {
            MetricValue::Number(x) if n == name => Some(*x),
            _ => None,
        })
    }

    pub(super) fn update<T>(
        &self,
        key: &(String, MetricKind),
        f: impl FnOnce(&mut MetricValue) -> T,
    ) -> T {
        let mut values = self
            .values
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let value = values.entry(key.clone()).or_insert_with(|| match key.1 {
            MetricKind::Histogram => MetricValue::Samples(Vec::new()),
            _ => MetricValue::Number(0),
        });
        f(value)
    }
}

/// One VM's ids for the registry's metrics.
pub struct VmMetrics {
    pub(super) registry: std::sync::Arc<MetricRegistry>,
    pub(super) ids: HashMap<u32, (String, MetricKind)>,
    pub(super) next: u32,
}

impl VmMetrics {
    /// No metrics defined yet.
    pub fn new(registry: std::sync::Arc<MetricRegistry>) -> VmMetrics {
        VmMetrics {
            registry,
            ids: HashMap::default(),
            next: 1,
        }
    }
}
