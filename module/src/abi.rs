//! The part of Envoy's dynamic-module ABI sluice uses, written from Envoy's
//! `source/extensions/dynamic_modules/abi/abi.h` (ABI v0.2.0, Envoy 1.40): the types, and the
//! callbacks Envoy exports. The hooks Envoy calls are in [`crate::hooks`].
//!
//! Every name here is checked against the Envoy binary's exports by the test
//! `module_abi_names_are_envoys` (tests/e2e).

#![allow(unsafe_code, missing_docs, non_camel_case_types)]

use std::ffi::c_void;

/// The ABI version the module was written against; Envoy 1.40 logs "ABI version v0.2.0
/// matched" for it.
pub const ABI_VERSION: &std::ffi::CStr = c"v0.2.0";

/// Bytes owned by Envoy, valid for the hook that handed them over.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

impl EnvoyBuffer {
    /// The bytes, empty for a null buffer.
    ///
    /// # Safety
    /// `ptr` must point at `length` readable bytes for `'a` (Envoy's promise for the hook
    /// that handed the buffer over, or until a setter is called).
    pub unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.ptr.is_null() || self.length == 0 {
            return &[];
        }
        // SAFETY: the caller's promise above.
        unsafe { std::slice::from_raw_parts(self.ptr, self.length) }
    }

    pub const EMPTY: EnvoyBuffer = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };
}

/// Bytes owned by the module, read by Envoy during the callback it is passed to.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

impl ModuleBuffer {
    pub fn of(bytes: &[u8]) -> ModuleBuffer {
        ModuleBuffer {
            ptr: bytes.as_ptr(),
            length: bytes.len(),
        }
    }
}

/// A header the module hands Envoy.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleHttpHeader {
    pub key_ptr: *const u8,
    pub key_length: usize,
    pub value_ptr: *const u8,
    pub value_length: usize,
}

impl ModuleHttpHeader {
    pub fn of(key: &str, value: &str) -> ModuleHttpHeader {
        ModuleHttpHeader {
            key_ptr: key.as_ptr(),
            key_length: key.len(),
            value_ptr: value.as_ptr(),
            value_length: value.len(),
        }
    }
}

/// A header of Envoy's, valid for the hook that handed it over.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyHttpHeader {
    pub key_ptr: *const u8,
    pub key_length: usize,
    pub value_ptr: *const u8,
    pub value_length: usize,
}

impl EnvoyHttpHeader {
    pub const EMPTY: EnvoyHttpHeader = EnvoyHttpHeader {
        key_ptr: std::ptr::null(),
        key_length: 0,
        value_ptr: std::ptr::null(),
        value_length: 0,
    };

    /// The name's and the value's bytes.
    ///
    /// # Safety
    /// As [`EnvoyBuffer::bytes`], for both.
    pub unsafe fn bytes<'a>(&self) -> (&'a [u8], &'a [u8]) {
        let key = EnvoyBuffer {
            ptr: self.key_ptr,
            length: self.key_length,
        };
        let value = EnvoyBuffer {
            ptr: self.value_ptr,
            length: self.value_length,
        };
        // SAFETY: the caller's promise.
        unsafe { (key.bytes(), value.bytes()) }
    }
}

/// `DynamicModuleHttpFilterConfig` in Envoy.
pub type ConfigEnvoyPtr = *mut c_void;
/// `DynamicModuleHttpFilter` in Envoy: one stream's filter.
pub type FilterEnvoyPtr = *mut c_void;
/// `DynamicModuleHttpFilterScheduler` in Envoy: schedules a filter on its worker.
pub type SchedulerPtr = *mut c_void;
/// `DynamicModuleHttpFilterConfigScheduler` in Envoy: schedules the configuration's hook on
/// the main thread.
pub type ConfigSchedulerPtr = *mut c_void;
/// The module's own configuration object.
pub type ConfigModulePtr = *const c_void;
/// The module's own per-stream filter object.
pub type FilterModulePtr = *const c_void;

// envoy_dynamic_module_type_http_header_type
pub const REQUEST_HEADER: u32 = 0;
pub const RESPONSE_HEADER: u32 = 2;

// envoy_dynamic_module_type_on_http_filter_request_headers_status (and the other statuses:
// 0 is Continue in each)
pub const CONTINUE: u32 = 0;
/// Stops the headers and whatever body follows them, buffered up to the watermark, until the
/// module continues the request. (StopIteration, 1, stops the headers alone: a body arriving
/// meanwhile takes them on to the upstream before the decision.)
pub const STOP_ALL_ITERATION_AND_WATERMARK: u32 = 4;

// envoy_dynamic_module_type_http_callout_init_result
pub const CALLOUT_INIT_SUCCESS: u32 = 0;
pub const CALLOUT_INIT_MISSING_REQUIRED_HEADERS: u32 = 1;
pub const CALLOUT_INIT_CLUSTER_NOT_FOUND: u32 = 2;
pub const CALLOUT_INIT_DUPLICATE_CALLOUT_ID: u32 = 3;
/// Envoy's async client failed the request at once, as it does when no host of the cluster is
/// healthy. Envoy 1.40 then calls no callout hook for it (every call of the hook logged, one
/// per callout sent, none for these); an Envoy that answered it inline, from within the post,
/// would find that answer left to the post's error (`envoy::posting`).
pub const CALLOUT_INIT_CANNOT_CREATE_REQUEST: u32 = 4;
// envoy_dynamic_module_type_http_callout_result
pub const CALLOUT_SUCCESS: u32 = 0;

// envoy_dynamic_module_type_attribute_id
pub const ATTRIBUTE_SOURCE_ADDRESS: u32 = 24;

// envoy_dynamic_module_type_metrics_result
pub const METRICS_SUCCESS: u32 = 0;

// envoy_dynamic_module_type_log_level
pub const LOG_WARN: u32 = 3;
pub const LOG_ERROR: u32 = 4;

unsafe extern "C" {
    pub fn envoy_dynamic_module_callback_log(level: u32, message: ModuleBuffer);
    pub fn envoy_dynamic_module_callback_http_get_headers_size(
        filter: FilterEnvoyPtr,
        header_type: u32,
    ) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_headers(
        filter: FilterEnvoyPtr,
        header_type: u32,
        result_headers: *mut EnvoyHttpHeader,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_add_header(
        filter: FilterEnvoyPtr,
        header_type: u32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_send_response(
        filter: FilterEnvoyPtr,
        status_code: u32,
        headers: *mut ModuleHttpHeader,
        headers_size: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );
    pub fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
        filter: FilterEnvoyPtr,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter: FilterEnvoyPtr,
        attribute_id: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_filter_http_callout(
        filter: FilterEnvoyPtr,
        callout_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *mut ModuleHttpHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_milliseconds: u64,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_config_http_callout(
        config: ConfigEnvoyPtr,
        callout_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *mut ModuleHttpHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_milliseconds: u64,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_continue_decoding(filter: FilterEnvoyPtr);
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_new(
        filter: FilterEnvoyPtr,
    ) -> SchedulerPtr;
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_commit(
        scheduler: SchedulerPtr,
        event_id: u64,
    );
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler: SchedulerPtr);
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
        config: ConfigEnvoyPtr,
    ) -> ConfigSchedulerPtr;
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
        scheduler: ConfigSchedulerPtr,
        event_id: u64,
    );
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(
        scheduler: ConfigSchedulerPtr,
    );
    pub fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: ConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        counter_id: *mut usize,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_increment_counter(
        filter: FilterEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
        config: ConfigEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
}

/// Every callback above, for the test that holds them against Envoy's exports.
pub const CALLBACKS: &[&str] = &[
    "envoy_dynamic_module_callback_log",
    "envoy_dynamic_module_callback_http_get_headers_size",
    "envoy_dynamic_module_callback_http_get_headers",
    "envoy_dynamic_module_callback_http_add_header",
    "envoy_dynamic_module_callback_http_send_response",
    "envoy_dynamic_module_callback_http_set_filter_state_bytes",
    "envoy_dynamic_module_callback_http_filter_get_attribute_string",
    "envoy_dynamic_module_callback_http_filter_http_callout",
    "envoy_dynamic_module_callback_http_filter_config_http_callout",
    "envoy_dynamic_module_callback_http_filter_continue_decoding",
    "envoy_dynamic_module_callback_http_filter_scheduler_new",
    "envoy_dynamic_module_callback_http_filter_scheduler_commit",
    "envoy_dynamic_module_callback_http_filter_scheduler_delete",
    "envoy_dynamic_module_callback_http_filter_config_scheduler_new",
    "envoy_dynamic_module_callback_http_filter_config_scheduler_commit",
    "envoy_dynamic_module_callback_http_filter_config_scheduler_delete",
    "envoy_dynamic_module_callback_http_filter_config_define_counter",
    "envoy_dynamic_module_callback_http_filter_config_increment_counter",
    "envoy_dynamic_module_callback_http_filter_increment_counter",
];
