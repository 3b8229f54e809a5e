//! sluice-noop-module: what any Envoy dynamic module HTTP filter costs before it does anything.
//! It has a configuration and a filter per request, as sluice's module does, and every hook
//! Envoy resolves answers at once: continue. `make bench` sets the module's per-request cost
//! beside it. (The hooks' signatures are `module/src/hooks/`'s; those that read none of their
//! arguments take them as plain words.)
//!
//! Configured under the filter name `floor`, it is instead what any module that keys a limit on
//! a header and records its decision for access logs must ask of Envoy, and nothing more: it
//! lists the request's headers, finds `x-api-key`, counts the request in two counters and sets
//! a decision's filter state, as sluice's module does in lease mode. sluice's lease path is
//! measured over it too.

#![allow(unsafe_code, missing_docs)]

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

// The bindings and handles sluice's module is built with, compiled here too: the floor makes
// Envoy the very calls sluice's module makes, through one definition of each.
#[path = "../../../module/src/abi.rs"]
#[allow(dead_code)]
mod abi;
#[path = "../../../module/src/envoy.rs"]
#[allow(dead_code)]
mod envoy;

use abi::{ConfigEnvoyPtr, EnvoyBuffer, FilterEnvoyPtr};
use envoy::{Config, Filter};

/// A non-null object for Envoy to hand back (a null configuration or filter is a failure):
/// the no-op's configuration and filters.
static NOOP: u8 = 0;

/// The floor's configuration and filters: its two counters' ids.
static FLOOR: Floor = Floor {
    counters: [AtomicUsize::new(0), AtomicUsize::new(0)],
};

struct Floor {
    counters: [AtomicUsize; 2],
}

/// The header the floor keys on, as the bench's requests carry it.
const KEY_HEADER: &str = "x-api-key";

/// The filter state the floor sets (as short as sluice's `sluice.decision`: Envoy keeps
/// either in place, in its string's own bytes).
const DECISION_KEY: &str = "floor.decision";

/// A decision record of the size sluice's module writes for one leased check.
const RECORD: &[u8] = br#"[{"rule":"per_key","key":"k1","outcome":"allowed","local":true}]"#;

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const std::ffi::c_char {
    abi::ABI_VERSION.as_ptr()
}

/// # Safety
/// Envoy passes its live configuration and buffers valid for the hook.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy: ConfigEnvoyPtr,
    name: EnvoyBuffer,
    _filter_config: EnvoyBuffer,
) -> *const c_void {
    // SAFETY: Envoy's buffer, valid for this hook.
    if unsafe { name.bytes() } != b"floor" {
        return std::ptr::from_ref(&NOOP).cast();
    }
    let config = Config(config_envoy);
    for (counter, name) in FLOOR.counters.iter().zip(["floor_local", "floor_allowed"]) {
        let Some(id) = config.define_counter(name) else {
            return std::ptr::null();
        };
        counter.store(id, Ordering::Relaxed);
    }
    std::ptr::from_ref(&FLOOR).cast()
}

/// A filter is its configuration: the no-op's or the floor's.
#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(config: *const c_void) -> *const c_void {
    config
}

/// # Safety
/// Envoy passes the live filter of the stream whose headers these are, and the filter
/// `on_http_filter_new` made for it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    envoy: FilterEnvoyPtr,
    filter: *const c_void,
) -> u32 {
    if std::ptr::eq(filter, std::ptr::from_ref(&FLOOR).cast()) {
        floor(Filter(envoy));
    }
    abi::CONTINUE
}

/// The floor's work on one request, during its request-headers hook: what sluice's module
/// asks of Envoy in lease mode.
fn floor(filter: Filter) {
    // SAFETY: the value is only looked at here, within the hook, the headers unchanged.
    if unsafe { filter.request_header(KEY_HEADER) }.is_none() {
        return;
    }
    for counter in &FLOOR.counters {
        filter.increment_counter(counter.load(Ordering::Relaxed), 1);
    }
    filter.set_filter_state(DECISION_KEY, RECORD);
}

/// Hooks that answer Continue (0) or nothing, whatever they are handed.
macro_rules! inert {
    ($($hook:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        pub extern "C" fn $hook() -> u32 {
            0
        }
    )*};
}

inert!(
    envoy_dynamic_module_on_http_filter_config_destroy,
    envoy_dynamic_module_on_http_filter_per_route_config_new,
    envoy_dynamic_module_on_http_filter_per_route_config_destroy,
    envoy_dynamic_module_on_http_filter_request_body,
    envoy_dynamic_module_on_http_filter_request_trailers,
    envoy_dynamic_module_on_http_filter_response_headers,
    envoy_dynamic_module_on_http_filter_response_body,
    envoy_dynamic_module_on_http_filter_response_trailers,
    envoy_dynamic_module_on_http_filter_stream_complete,
    envoy_dynamic_module_on_http_filter_destroy,
    envoy_dynamic_module_on_http_filter_http_callout_done,
    envoy_dynamic_module_on_http_filter_http_stream_headers,
    envoy_dynamic_module_on_http_filter_http_stream_data,
    envoy_dynamic_module_on_http_filter_http_stream_trailers,
    envoy_dynamic_module_on_http_filter_http_stream_complete,
    envoy_dynamic_module_on_http_filter_http_stream_reset,
    envoy_dynamic_module_on_http_filter_scheduled,
    envoy_dynamic_module_on_http_filter_config_scheduled,
    envoy_dynamic_module_on_http_filter_config_http_callout_done,
    envoy_dynamic_module_on_http_filter_config_http_stream_headers,
    envoy_dynamic_module_on_http_filter_config_http_stream_data,
    envoy_dynamic_module_on_http_filter_config_http_stream_trailers,
    envoy_dynamic_module_on_http_filter_config_http_stream_complete,
    envoy_dynamic_module_on_http_filter_config_http_stream_reset,
    envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark,
    envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark,
    envoy_dynamic_module_on_http_filter_local_reply,
);
