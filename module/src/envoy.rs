//! Safe handles on Envoy's objects: a filter configuration and one stream's filter, each
//! method one ABI callback.
//!
//! A handle is only made from a pointer Envoy handed a hook, and used during that hook or,
//! for a stream's filter, until Envoy destroys the filter (`on_http_filter_destroy`), which is
//! what the ABI promises for it. Neither is sent to another thread.

#![allow(unsafe_code)]

use std::cell::Cell;
use std::fmt;
use std::mem::MaybeUninit;

use crate::abi::{
    self, ConfigEnvoyPtr, EnvoyBuffer, EnvoyHttpHeader, FilterEnvoyPtr, ModuleBuffer,
    ModuleHttpHeader,
};

/// Writes `message` to Envoy's log, at `level` (`abi::LOG_*`).
pub fn log(level: u32, message: &str) {
    // SAFETY: the buffer describes a live string Envoy only reads during the call.
    unsafe { abi::envoy_dynamic_module_callback_log(level, ModuleBuffer::of(message.as_bytes())) }
}

/// A filter configuration in Envoy, during one of its hooks (`on_http_filter_config_*`, on the
/// main thread).
pub struct Config(pub ConfigEnvoyPtr);

impl Config {
    /// Posts `body` through `cluster` from the configuration, on the main thread; its answer
    /// comes to `on_http_filter_config_http_callout_done`. The callout's id, or why Envoy
    /// would not send it.
    pub fn post<'a>(
        &self,
        cluster: &str,
        headers: impl IntoIterator<Item = (&'a str, &'a str)>,
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u64, CalloutRefused> {
        // SAFETY: the configuration pointer is live for the hook.
        unsafe {
            post_with(
                abi::envoy_dynamic_module_callback_http_filter_config_http_callout,
                self.0,
                (cluster, headers, body, timeout_ms),
            )
        }
    }

    /// Adds `value` to counter `id`.
    pub fn increment_counter(&self, id: usize, value: u64) {
        // SAFETY: the configuration pointer is live for the hook; the counter has no labels
        // (null, 0).
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_config_increment_counter(
                self.0,
                id,
                std::ptr::null_mut(),
                0,
                value,
            );
        }
    }

    /// Defines counter `name` (Envoy adds the filter's metrics namespace); its id, or `None`
    /// if Envoy refused it.
    pub fn define_counter(&self, name: &str) -> Option<usize> {
        let mut id = 0usize;
        // SAFETY: the pointer came from the hook being run; the name is a live buffer Envoy
        // only reads; no labels (a null pointer with a length of 0, as the ABI allows); `id`
        // is a live local Envoy writes.
        let result = unsafe {
            abi::envoy_dynamic_module_callback_http_filter_config_define_counter(
                self.0,
                ModuleBuffer::of(name.as_bytes()),
                std::ptr::null_mut(),
                0,
                &mut id,
            )
        };
        (result == abi::METRICS_SUCCESS).then_some(id)
    }
}

/// One stream's filter in Envoy.
#[derive(Clone, Copy)]
pub struct Filter(pub FilterEnvoyPtr);

impl Filter {
    /// The first value of request header `name` (lower case, as Envoy keeps names), in
    /// Envoy's header map.
    ///
    /// Found among every header Envoy lists in place, not asked for by name: Envoy's lookup by
    /// name makes its own lower-case copy of the name and a list of the values, about 3,000
    /// of its instructions a request under callgrind, where listing a request's few headers
    /// costs a few hundred.
    ///
    /// # Safety
    /// The value is Envoy's, valid only while the hook that made this handle runs and the
    /// request's headers are not changed: it must not be used after either.
    pub unsafe fn request_header<'h>(&self, name: &str) -> Option<&'h [u8]> {
        // SAFETY: the filter pointer is live (see the module's docs).
        let size = unsafe {
            abi::envoy_dynamic_module_callback_http_get_headers_size(self.0, abi::REQUEST_HEADER)
        };
        let mut on_stack = [MaybeUninit::<EnvoyHttpHeader>::uninit(); 32];
        let mut more = Vec::new();
        let listed: &mut [MaybeUninit<EnvoyHttpHeader>] = if size <= on_stack.len() {
            &mut on_stack[..size]
        } else {
            more.resize(size, MaybeUninit::uninit());
            &mut more
        };
        // SAFETY: `listed` has room for the `size` headers Envoy just counted, and Envoy
        // writes no more than it holds.
        let ok = unsafe {
            abi::envoy_dynamic_module_callback_http_get_headers(
                self.0,
                abi::REQUEST_HEADER,
                listed.as_mut_ptr().cast(),
            )
        };
        if !ok {
            return None;
        }
        listed.iter().find_map(|h| {
            // SAFETY: Envoy wrote every one of the `size` headers it counted in this same
            // hook (its header map is the stream's, changed by no other thread); their
            // buffers are valid for as long as the caller promised.
            let h = unsafe { h.assume_init_ref() };
            // Most names differ in length: those are passed over without reading them.
            if h.key_length != name.len() {
                return None;
            }
            // SAFETY: as above.
            let (key, value) = unsafe { h.bytes() };
            (key == name.as_bytes()).then_some(value)
        })
    }

    /// Every request header, copied, in Envoy's order.
    pub fn request_headers(&self) -> Vec<(String, Vec<u8>)> {
        // SAFETY: the filter pointer is live.
        let size = unsafe {
            abi::envoy_dynamic_module_callback_http_get_headers_size(self.0, abi::REQUEST_HEADER)
        };
        let mut headers = vec![EnvoyHttpHeader::EMPTY; size];
        // SAFETY: `headers` has room for the `size` headers Envoy just counted, and Envoy
        // writes no more than it holds.
        let ok = unsafe {
            abi::envoy_dynamic_module_callback_http_get_headers(
                self.0,
                abi::REQUEST_HEADER,
                headers.as_mut_ptr(),
            )
        };
        if !ok {
            return Vec::new();
        }
        headers
            .iter()
            .map(|h| {
                // SAFETY: Envoy's buffers, valid until this hook ends; copied at once.
                let (key, value) = unsafe { h.bytes() };
                (String::from_utf8_lossy(key).into_owned(), value.to_vec())
            })
            .collect()
    }

    /// The peer's address, `ip:port`.
    pub fn source_address(&self) -> Option<String> {
        let mut value = EnvoyBuffer::EMPTY;
        // SAFETY: the filter pointer is live; `value` is a live local Envoy writes.
        let found = unsafe {
            abi::envoy_dynamic_module_callback_http_filter_get_attribute_string(
                self.0,
                abi::ATTRIBUTE_SOURCE_ADDRESS,
                &mut value,
            )
        };
        // SAFETY: Envoy's buffer, valid until this hook ends; copied at once.
        found.then(|| String::from_utf8_lossy(unsafe { value.bytes() }).into_owned())
    }

    /// Adds a response header.
    pub fn add_response_header(&self, name: &str, value: &str) {
        // SAFETY: the filter pointer is live; both buffers are live strings Envoy copies.
        unsafe {
            abi::envoy_dynamic_module_callback_http_add_header(
                self.0,
                abi::RESPONSE_HEADER,
                ModuleBuffer::of(name.as_bytes()),
                ModuleBuffer::of(value.as_bytes()),
            );
        }
    }

    /// Replies locally with `status`, `headers` and `body`.
    pub fn send_response(
        &self,
        status: u16,
        headers: &[(String, String)],
        body: &str,
        details: &str,
    ) {
        let mut headers: Vec<ModuleHttpHeader> = headers
            .iter()
            .map(|(n, v)| ModuleHttpHeader::of(n, v))
            .collect();
        // SAFETY: the filter pointer is live; the headers point into `headers`' strings,
        // live for the call, and Envoy copies them.
        unsafe {
            abi::envoy_dynamic_module_callback_http_send_response(
                self.0,
                u32::from(status),
                headers.as_mut_ptr(),
                headers.len(),
                ModuleBuffer::of(body.as_bytes()),
                ModuleBuffer::of(details.as_bytes()),
            );
        }
    }

    /// Sets filter state `key` to `value` for access logs.
    pub fn set_filter_state(&self, key: &str, value: &[u8]) {
        // SAFETY: the filter pointer is live; both buffers are live and Envoy copies them.
        unsafe {
            abi::envoy_dynamic_module_callback_http_set_filter_state_bytes(
                self.0,
                ModuleBuffer::of(key.as_bytes()),
                ModuleBuffer::of(value),
            );
        }
    }

    /// Posts `body` through `cluster` for this stream; its answer comes to
    /// `on_http_filter_http_callout_done`. The callout's id, or why Envoy would not send it.
    ///
    /// A callout Envoy fails at once (no healthy host) could be answered inline, from within
    /// this call, before its id is known (Envoy 1.40 does not answer it at all): while it
    /// runs, [`posting`] says so for this filter, and the hook would leave that answer to this
    /// call's error.
    pub fn post<'a>(
        &self,
        cluster: &str,
        headers: impl IntoIterator<Item = (&'a str, &'a str)>,
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u64, CalloutRefused> {
        POSTING.set(self.0 as usize);
        // SAFETY: the filter pointer is live (see the module's docs).
        let posted = unsafe {
            post_with(
                abi::envoy_dynamic_module_callback_http_filter_http_callout,
                self.0,
                (cluster, headers, body, timeout_ms),
            )
        };
        POSTING.set(0);
        posted
    }

    /// Lets the paused request go on.
    pub fn continue_request(&self) {
        // SAFETY: the filter pointer is live.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_continue_decoding(self.0) }
    }

    /// A scheduler for this filter, which another thread may commit to.
    pub fn scheduler(&self) -> Option<abi::SchedulerPtr> {
        // SAFETY: the filter pointer is live.
        let scheduler =
            unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_new(self.0) };
        (!scheduler.is_null()).then_some(scheduler)
    }

    /// Adds `value` to counter `id`.
    pub fn increment_counter(&self, id: usize, value: u64) {
        // SAFETY: the filter pointer is live; the counter has no labels (null, 0).
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_increment_counter(
                self.0,
                id,
                std::ptr::null_mut(),
                0,
                value,
            );
        }
    }
}

thread_local! {
    /// The filter whose callout this thread is handing to Envoy, while it does (0: none).
    static POSTING: Cell<usize> = const { Cell::new(0) };
}

/// Whether `filter`'s hook on this thread is in [`Filter::post`]: a callout answer for it now
/// would be an inline answer to a callout Envoy failed at once, whose stream the posting hook
/// holds.
pub fn posting(filter: FilterEnvoyPtr) -> bool {
    !filter.is_null() && POSTING.get() == filter as usize
}

/// Why Envoy would not send a callout: its init result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CalloutRefused(pub u32);

impl fmt::Display for CalloutRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.0 {
            abi::CALLOUT_INIT_CLUSTER_NOT_FOUND => "Envoy has no such cluster",
            abi::CALLOUT_INIT_CANNOT_CREATE_REQUEST => {
                "Envoy failed it at once, as when no host of the cluster is healthy"
            }
            abi::CALLOUT_INIT_MISSING_REQUIRED_HEADERS => "a header Envoy requires was missing",
            abi::CALLOUT_INIT_DUPLICATE_CALLOUT_ID => "Envoy had a callout of its id already",
            _ => "Envoy refused it",
        };
        write!(f, "{why} (init result {})", self.0)
    }
}

/// The ABI's callout callbacks, a filter's and a configuration's alike: Envoy's object, where
/// to write the id, the cluster, the headers, the body, the timeout.
type Callout = unsafe extern "C" fn(
    *mut std::ffi::c_void,
    *mut u64,
    ModuleBuffer,
    *mut ModuleHttpHeader,
    usize,
    ModuleBuffer,
    u64,
) -> u32;

/// How many callout headers are handed to Envoy from the stack: a callout has four, five
/// with a bearer token.
const CALLOUT_HEADERS_ON_STACK: usize = 8;

/// Posts `body` to `cluster` with `headers` and a timeout, through `callout` on `envoy`: the
/// callout's id, or why Envoy would not send it.
///
/// # Safety
/// `envoy` must be the live object `callout` takes (a filter's or a configuration's).
unsafe fn post_with<'a>(
    callout: Callout,
    envoy: *mut std::ffi::c_void,
    (cluster, headers, body, timeout_ms): (
        &str,
        impl IntoIterator<Item = (&'a str, &'a str)>,
        &[u8],
        u64,
    ),
) -> Result<u64, CalloutRefused> {
    let mut on_stack = [MaybeUninit::<ModuleHttpHeader>::uninit(); CALLOUT_HEADERS_ON_STACK];
    let mut spilled = Vec::new();
    let mut count = 0;
    for (name, value) in headers {
        let header = ModuleHttpHeader::of(name, value);
        if count < on_stack.len() {
            on_stack[count].write(header);
        } else {
            if spilled.is_empty() {
                // SAFETY: all of `on_stack` was written, one header each in the turns before.
                spilled.extend(on_stack.iter().map(|h| unsafe { h.assume_init() }));
            }
            spilled.push(header);
        }
        count += 1;
    }
    let headers: *mut ModuleHttpHeader = if spilled.is_empty() {
        on_stack.as_mut_ptr().cast()
    } else {
        spilled.as_mut_ptr()
    };
    let mut id = 0u64;
    // SAFETY: the caller's promise for `envoy`; every buffer is live for the call and Envoy
    // copies what it keeps; `id` is a live local Envoy writes.
    let result = unsafe {
        callout(
            envoy,
            &mut id,
            ModuleBuffer::of(cluster.as_bytes()),
            // The first `count` of `on_stack`, each written above, or all of `spilled`.
            headers,
            count,
            ModuleBuffer::of(body),
            timeout_ms,
        )
    };
    if result == abi::CALLOUT_INIT_SUCCESS {
        Ok(id)
    } else {
        Err(CalloutRefused(result))
    }
}
