//! The hooks sluice has no use for, which Envoy resolves all the same (Envoy 1.40 refuses a
//! module missing any): each does nothing and lets the stream go on.

#![allow(unsafe_code, missing_docs)]

use crate::abi::{
    self, ConfigEnvoyPtr, ConfigModulePtr, EnvoyBuffer, EnvoyHttpHeader, FilterEnvoyPtr,
    FilterModulePtr,
};

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> ConfigModulePtr {
    // sluice takes no per-route configuration: a null answer makes Envoy refuse one.
    std::ptr::null()
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(
    _config: ConfigModulePtr,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _end_of_stream: bool,
) -> u32 {
    abi::CONTINUE
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
) -> u32 {
    abi::CONTINUE
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _end_of_stream: bool,
) -> u32 {
    abi::CONTINUE
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
) -> u32 {
    abi::CONTINUE
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _stream_id: u64,
    _headers: *const EnvoyHttpHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _stream_id: u64,
    _trailers: *const EnvoyHttpHeader,
    _trailers_size: usize,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _stream_id: u64,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _stream_id: u64,
    _reason: u32,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_headers(
    _config_envoy: ConfigEnvoyPtr,
    _config: ConfigModulePtr,
    _stream_id: u64,
    _headers: *const EnvoyHttpHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_data(
    _config_envoy: ConfigEnvoyPtr,
    _config: ConfigModulePtr,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_trailers(
    _config_envoy: ConfigEnvoyPtr,
    _config: ConfigModulePtr,
    _stream_id: u64,
    _trailers: *const EnvoyHttpHeader,
    _trailers_size: usize,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_complete(
    _config_envoy: ConfigEnvoyPtr,
    _config: ConfigModulePtr,
    _stream_id: u64,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_reset(
    _config_envoy: ConfigEnvoyPtr,
    _config: ConfigModulePtr,
    _stream_id: u64,
    _reason: u32,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_local_reply(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _response_code: u32,
    _details: EnvoyBuffer,
    _reset_imminent: bool,
) -> u32 {
    abi::CONTINUE
}
