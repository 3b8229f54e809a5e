//! Metrics: `proxy_define_metric`, `proxy_increment_metric`, `proxy_record_metric`,
//! `proxy_get_metric`.
//!
//! As in Envoy: a name defined by several VMs is one stat (the store is the Envoy process's),
//! shown as `wasmcustom.<name>`; a metric id carries its type in the low two bits; a counter
//! incremented by zero or less is `BadArgument`; a gauge goes up and down.

use std::collections::BTreeMap;

// Looked up by every host call: a fast hash, not a DoS-resistant one (no key here is chosen
// by a client).
use rustc_hash::FxHashMap as HashMap;
use std::sync::Mutex;

use wasmtime::{Caller, Linker};

use super::abi::Status;
use super::memory::{self, HostResult, finish, status};
use super::state::HostState;

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

    fn update<T>(&self, key: &(String, MetricKind), f: impl FnOnce(&mut MetricValue) -> T) -> T {
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
    registry: std::sync::Arc<MetricRegistry>,
    ids: HashMap<u32, (String, MetricKind)>,
    next: u32,
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

fn define(
    mut caller: Caller<'_, HostState>,
    kind: i32,
    name_ptr: i32,
    name_len: i32,
    id_ptr: i32,
) -> HostResult {
    let kind = match kind {
        0 => MetricKind::Counter,
        1 => MetricKind::Gauge,
        2 => MetricKind::Histogram,
        _ => return status(Status::BadArgument),
    };
    let name = match memory::read(&mut caller, name_ptr, name_len) {
        Ok(n) => String::from_utf8_lossy(&n).into_owned(),
        Err(s) => return status(s),
    };
    let metrics = &mut caller.data_mut().metrics;
    let id = (metrics.next << 2) | kind as u32;
    metrics.next += 1;
    metrics.registry.update(&(name.clone(), kind), |_| ());
    metrics.ids.insert(id, (name, kind));
    finish(Ok(memory::write_u32(&mut caller, id_ptr, id)))
}

fn increment(caller: Caller<'_, HostState>, id: i32, offset: i64) -> HostResult {
    let metrics = &caller.data().metrics;
    let Some(key) = metrics.ids.get(&(id as u32)) else {
        return status(if (id & 3) > 1 {
            Status::BadArgument
        } else {
            Status::NotFound
        });
    };
    match key.1 {
        MetricKind::Counter if offset <= 0 => status(Status::BadArgument),
        MetricKind::Histogram => status(Status::BadArgument),
        _ => {
            metrics.registry.update(key, |v| {
                if let MetricValue::Number(n) = v {
                    *n = n.saturating_add(offset);
                }
            });
            status(Status::Ok)
        }
    }
}

fn record(caller: Caller<'_, HostState>, id: i32, value: i64) -> HostResult {
    let metrics = &caller.data().metrics;
    let Some(key) = metrics.ids.get(&(id as u32)) else {
        return status(Status::NotFound);
    };
    metrics.registry.update(key, |v| match (key.1, v) {
        (MetricKind::Counter, MetricValue::Number(n)) => *n = n.saturating_add(value),
        (MetricKind::Gauge, MetricValue::Number(n)) => *n = value,
        (MetricKind::Histogram, MetricValue::Samples(s)) => s.push(value as u64),
        _ => {}
    });
    status(Status::Ok)
}

fn get(mut caller: Caller<'_, HostState>, id: i32, value_ptr: i32) -> HostResult {
    let metrics = &caller.data().metrics;
    let Some(key) = metrics.ids.get(&(id as u32)).cloned() else {
        return status(if (id & 3) > 1 {
            Status::BadArgument
        } else {
            Status::NotFound
        });
    };
    let value = match metrics.registry.update(&key, |v| v.clone()) {
        MetricValue::Number(n) => n as u64,
        MetricValue::Samples(_) => return status(Status::BadArgument),
    };
    finish(Ok(memory::write_u64(&mut caller, value_ptr, value)))
}

/// Adds the metrics host calls.
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_define_metric", define)?;
    linker.func_wrap("env", "proxy_increment_metric", increment)?;
    linker.func_wrap("env", "proxy_record_metric", record)?;
    linker.func_wrap("env", "proxy_get_metric", get)?;
    Ok(())
}
