//! sluice-noop-module: what any Envoy dynamic module HTTP filter costs before it does anything.
//! It has a configuration and a filter per request, as sluice's module does, and every hook
//! Envoy resolves answers at once: continue. `make bench` sets the module's per-request cost
//! beside it. (The hooks' signatures are `module/src/hooks/`'s; this one reads none of its
//! arguments, so each takes them as plain words.)

#![allow(unsafe_code, missing_docs)]

use std::ffi::c_void;

/// A non-null object for Envoy to hand back: a null configuration or filter is a failure.
static OBJECT: u8 = 0;

fn object() -> *const c_void {
    std::ptr::from_ref(&OBJECT).cast()
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const std::ffi::c_char {
    c"v0.2.0".as_ptr()
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new() -> *const c_void {
    object()
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new() -> *const c_void {
    object()
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
    envoy_dynamic_module_on_http_filter_request_headers,
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
