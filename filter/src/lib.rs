//! sluice-filter: global rate limiting for Envoy, as a proxy-wasm HTTP filter.
//!
//! For each request the filter finds the rules that apply ([`sluice_core::policy`]), answers
//! from its local deny cache when it can, decides leased rules from the units leased to this
//! Envoy ([`lease`]), and makes one callout to sluice-server with every other check at once;
//! then it lets the request through, holds it (shaping), or replies 429 with `Retry-After` and
//! the rate-limit headers. When the service cannot answer, the
//! configured failure mode applies. Everything that can be decided without the host lives in
//! `sluice-core`; this crate is the glue: [`root`] (configuration, stats, tick, lease calls) and
//! [`stream`] (one request).
//!
//! Nothing here may panic: a trap fails the whole worker's VM and every request on it. Header
//! values are read as bytes, and a callout answer without headers is a failure, not a crash.

#![deny(missing_docs)]

mod alloc;
mod answer;
mod cache;
mod callout;
mod configured;
mod ffi;
mod held;
pub mod root;
mod shared_data;
mod stats;
pub mod stream;
mod ticker;
mod warnings;

use proxy_wasm::traits::RootContext;
use proxy_wasm::types::LogLevel;

#[cfg(target_family = "wasm")]
#[global_allocator]
static ALLOCATOR: alloc::ClassCache = alloc::ClassCache::new();

/// The module's `_initialize`, as the SDK writes it (it calls the C runtime's constructors).
#[allow(missing_docs, unsafe_code)]
mod entry {
    use super::*;

    proxy_wasm::main! {{
        proxy_wasm::set_log_level(LogLevel::Info);
        proxy_wasm::set_root_context(|_context_id| -> Box<dyn RootContext> { Box::new(root::Root::new()) });
    }}
}
