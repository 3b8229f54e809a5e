//! What the root context and its streams share: a configuration with its counters, caches,
//! leases and held streams, and the host's clock.

use std::time::UNIX_EPOCH;

use proxy_wasm::traits::Context;
use sluice_core::policy::Policy;

use crate::cache::DenyCache;
use crate::held::SharedHeld;
use crate::lease::Leases;
use crate::stats::Stats;
use crate::warnings::Warnings;

/// A configured root context: what it and every one of its streams share.
pub struct Configured {
    /// The validated configuration.
    pub policy: Policy,
    /// The counters.
    pub stats: Stats,
    /// The deny cache.
    pub cache: DenyCache,
    /// Streams held for shaping.
    pub held: SharedHeld,
    /// The leased rules' allowances.
    pub leases: Leases,
    /// Warnings that would repeat with every request, throttled.
    pub warnings: Warnings,
}

/// Host time in microseconds since the epoch.
pub fn now_us(context: &dyn Context) -> u64 {
    context
        .get_current_time()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
