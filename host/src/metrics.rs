//! Metrics: `proxy_define_metric`, `proxy_increment_metric`, `proxy_record_metric`,
//! `proxy_get_metric`.
//!
//! As in Envoy: a name defined by several VMs is one stat (the store is the Envoy process's),
//! shown as `wasmcustom.<name>`; a metric id carries its type in the low two bits; a counter
//! incremented by zero or less is `BadArgument`; a gauge goes up and down.

use wasmtime::{Caller, Linker};

use super::abi::Status;
use super::memory::{self, HostResult, finish, status};
use super::metric_registry::{MetricKind, MetricValue};
use super::state::HostState;

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
