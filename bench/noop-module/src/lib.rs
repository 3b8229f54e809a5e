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
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};

// The bindings sluice's module is built with: one definition of the ABI, compiled here too.
#[path = "../../../module/src/abi.rs"]
#[allow(dead_code)]
mod abi;

use abi::{ConfigEnvoyPtr, EnvoyBuffer, EnvoyHttpHeader, FilterEnvoyPtr, ModuleBuffer};

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
const KEY_HEADER: &[u8] = b"x-api-key";

/// The filter state the floor sets (as short as sluice's `sluice.decision`: Envoy keeps
/// either in place, in its string's own bytes).
const DECISION_KEY: &[u8] = b"floor.decision";

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
    for (counter, name) in FLOOR.counters.iter().zip(["floor_local", "floor_allowed"]) {
        let mut id = 0usize;
        // SAFETY: the configuration pointer is live for this hook; the name is a live buffer
        // Envoy only reads; no labels (null, 0); `id` is a live local Envoy writes.
        let defined = unsafe {
            abi::envoy_dynamic_module_callback_http_filter_config_define_counter(
                config_envoy,
                ModuleBuffer::of(name.as_bytes()),
                std::ptr::null_mut(),
                0,
                &mut id,
            )
        };
        if defined != abi::METRICS_SUCCESS {
            return std::ptr::null();
        }
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
        // SAFETY: Envoy's live filter, for this hook.
        unsafe { floor(envoy) };
    }
    abi::CONTINUE
}

/// The floor's work on one request: what sluice's module asks of Envoy in lease mode.
///
/// # Safety
/// `envoy` must be the filter Envoy handed the running request-headers hook.
unsafe fn floor(envoy: FilterEnvoyPtr) {
    // SAFETY: the caller's promise for `envoy`.
    let size = unsafe {
        abi::envoy_dynamic_module_callback_http_get_headers_size(envoy, abi::REQUEST_HEADER)
    };
    let mut listed = [MaybeUninit::<EnvoyHttpHeader>::uninit(); 32];
    let Some(listed) = listed.get_mut(..size) else {
        return;
    };
    // SAFETY: the caller's promise for `envoy`; `listed` has room for the `size` headers Envoy
    // just counted, and Envoy writes no more than it holds.
    let ok = unsafe {
        abi::envoy_dynamic_module_callback_http_get_headers(
            envoy,
            abi::REQUEST_HEADER,
            listed.as_mut_ptr().cast(),
        )
    };
    let keyed = ok
        && listed.iter().any(|h| {
            // SAFETY: Envoy wrote every one of the `size` headers it counted, in this hook;
            // their buffers are valid until it returns.
            let (key, value) = unsafe { h.assume_init_ref().bytes() };
            key == KEY_HEADER && !value.is_empty()
        });
    if !keyed {
        return;
    }
    for counter in &FLOOR.counters {
        // SAFETY: the caller's promise for `envoy`; the counter was defined by the
        // configuration; no labels (null, 0).
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_increment_counter(
                envoy,
                counter.load(Ordering::Relaxed),
                std::ptr::null_mut(),
                0,
                1,
            );
        }
    }
    // SAFETY: the caller's promise for `envoy`; both buffers are live statics Envoy copies.
    unsafe {
        abi::envoy_dynamic_module_callback_http_set_filter_state_bytes(
            envoy,
            ModuleBuffer::of(DECISION_KEY),
            ModuleBuffer::of(RECORD),
        );
    }
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
