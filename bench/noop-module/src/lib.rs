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
//!
//! Configured under the filter name `callout`, its configuration three lines (a cluster's name,
//! then a `/v1/decide` body before its key and after it), it is the floor of a module that asks
//! a server on every request: it finds `x-api-key` as the floor does, posts that body with the
//! key spliced in through the cluster, with the headers sluice's callouts carry, and pauses the
//! request; when the answer comes it reads its `:status`, counts and sets the filter state as
//! the floor does if it is 200, and lets the request go on. sluice's module per request is
//! measured over it.

#![allow(unsafe_code, missing_docs)]

use std::ffi::c_void;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

// The bindings and handles sluice's module is built with, compiled here too: the floor makes
// Envoy the very calls sluice's module makes, through one definition of each.
#[path = "../../../module/src/abi.rs"]
#[allow(dead_code)]
mod abi;
#[path = "../../../module/src/envoy.rs"]
#[allow(dead_code)]
mod envoy;

use abi::{ConfigEnvoyPtr, EnvoyBuffer, EnvoyHttpHeader, FilterEnvoyPtr};
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

/// The per-request floor's configuration and filters: the floor's counters, and what its
/// callouts are (one per process: the bench configures one such listener).
static CALLOUT: Callout = Callout {
    floor: Floor {
        counters: [AtomicUsize::new(0), AtomicUsize::new(0)],
    },
    asks: OnceLock::new(),
};

struct Callout {
    floor: Floor,
    asks: OnceLock<Asks>,
}

/// The cluster the per-request floor asks through, and its body around the key: the check
/// sluice's module sends for the bench's rule, the key spliced in as the header gives it (the
/// bench's keys need no escape).
#[derive(Clone, PartialEq, Eq)]
struct Asks {
    cluster: Box<str>,
    body_head: Box<[u8]>,
    body_tail: Box<[u8]>,
}

impl Asks {
    /// The three lines of the floor's configuration; `None` for any other text.
    fn parse(configuration: &[u8]) -> Option<Asks> {
        let mut lines = configuration.split(|&b| b == b'\n');
        let (Some(cluster), Some(head), Some(tail), None) =
            (lines.next(), lines.next(), lines.next(), lines.next())
        else {
            return None;
        };
        Some(Asks {
            cluster: std::str::from_utf8(cluster).ok()?.into(),
            body_head: head.into(),
            body_tail: tail.into(),
        })
    }
}

/// A callout's body is written on the stack: a key longer than this leaves the request be.
const BODY_ROOM: usize = 256;

/// The path and timeout of sluice's module's callouts.
const DECIDE_PATH: &str = "/v1/decide";
const TIMEOUT_MS: u64 = 100;

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
    filter_config: EnvoyBuffer,
) -> *const c_void {
    let config = Config(config_envoy);
    // SAFETY: Envoy's buffers, valid for this hook.
    let (name, filter_config) = unsafe { (name.bytes(), filter_config.bytes()) };
    match name {
        b"floor" if FLOOR.define_counters(&config) => std::ptr::from_ref(&FLOOR).cast(),
        b"callout" => {
            let Some(asks) = Asks::parse(filter_config) else {
                return std::ptr::null();
            };
            // One configuration for the process's one such listener; another is refused.
            let kept = CALLOUT.asks.get_or_init(|| asks.clone());
            if *kept != asks || !CALLOUT.floor.define_counters(&config) {
                return std::ptr::null();
            }
            std::ptr::from_ref(&CALLOUT).cast()
        }
        b"floor" => std::ptr::null(),
        _ => std::ptr::from_ref(&NOOP).cast(),
    }
}

impl Floor {
    /// Defines the floor's counters; false if Envoy refused one.
    fn define_counters(&self, config: &Config) -> bool {
        for (counter, name) in self.counters.iter().zip(["floor_local", "floor_allowed"]) {
            let Some(id) = config.define_counter(name) else {
                return false;
            };
            counter.store(id, Ordering::Relaxed);
        }
        true
    }

    /// Counts a request and sets its decision's filter state: what sluice's module asks of
    /// Envoy once it has decided.
    fn conclude(&self, filter: Filter) {
        for counter in &self.counters {
            filter.increment_counter(counter.load(Ordering::Relaxed), 1);
        }
        filter.set_filter_state(DECISION_KEY, RECORD);
    }
}

/// A filter is its configuration: the no-op's or a floor's.
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
    } else if std::ptr::eq(filter, std::ptr::from_ref(&CALLOUT).cast()) {
        return ask(Filter(envoy));
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
    FLOOR.conclude(filter);
}

/// The per-request floor's work in the request-headers hook: the key's callout sent, the
/// request paused until it is answered; what it answers to the hook.
fn ask(filter: Filter) -> u32 {
    // SAFETY: the value is only copied into the body here, within the hook.
    let Some(key) = (unsafe { filter.request_header(KEY_HEADER) }) else {
        return abi::CONTINUE;
    };
    let Some(asks) = CALLOUT.asks.get() else {
        return abi::CONTINUE;
    };
    let (body_head, body_tail) = (&*asks.body_head, &*asks.body_tail);
    let length = body_head.len() + key.len() + body_tail.len();
    if length > BODY_ROOM {
        return abi::CONTINUE;
    }
    let mut body = [0u8; BODY_ROOM];
    let (head, rest) = body.split_at_mut(body_head.len());
    let (middle, tail) = rest.split_at_mut(key.len());
    head.copy_from_slice(body_head);
    middle.copy_from_slice(key);
    tail[..body_tail.len()].copy_from_slice(body_tail);
    let cluster = &*asks.cluster;
    let headers = [
        (":method", "POST"),
        (":path", DECIDE_PATH),
        (":authority", cluster),
    ];
    match filter.post(cluster, headers, &body[..length], TIMEOUT_MS) {
        Ok(_) => abi::STOP_ALL_ITERATION_AND_WATERMARK,
        Err(_) => abi::CONTINUE,
    }
}

/// # Safety
/// Envoy passes the live filter of the stream whose callout this answers, and the answer's
/// headers as an array of `headers_size`, valid for the hook.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    envoy: FilterEnvoyPtr,
    filter: *const c_void,
    _callout_id: u64,
    result: u32,
    headers: *const EnvoyHttpHeader,
    headers_size: usize,
) {
    if !std::ptr::eq(filter, std::ptr::from_ref(&CALLOUT).cast()) {
        return;
    }
    let filter = Filter(envoy);
    let headers = if result == abi::CALLOUT_SUCCESS && !headers.is_null() {
        // SAFETY: Envoy's array of the size it gives, valid for this hook.
        unsafe { std::slice::from_raw_parts(headers, headers_size) }
    } else {
        &[]
    };
    // SAFETY: Envoy's buffers, valid for this hook.
    let status = headers
        .iter()
        .map(|h| unsafe { h.bytes() })
        .find_map(|(name, value)| (name == b":status").then_some(value));
    if status == Some(b"200") {
        CALLOUT.floor.conclude(filter);
    }
    filter.continue_request();
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

#[cfg(test)]
mod tests {
    use super::Asks;

    #[test]
    fn the_callout_floor_takes_a_cluster_and_a_body_around_its_key_and_nothing_else() {
        let asks = Asks::parse(b"sluice\n{\"k\":\"\n\"}").expect("three lines");
        assert_eq!(&*asks.cluster, "sluice");
        assert_eq!(
            (&*asks.body_head, &*asks.body_tail),
            (&b"{\"k\":\""[..], &b"\"}"[..])
        );
        assert!(Asks::parse(b"sluice").is_none(), "a cluster alone");
        assert!(Asks::parse(b"sluice\na\nb\nc").is_none(), "a fourth line");
    }
}
