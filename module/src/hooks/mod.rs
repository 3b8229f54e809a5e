//! The hooks Envoy calls, every one it resolves for an HTTP filter (Envoy 1.40 refuses a
//! module missing any). Each is a thin shell: no panic crosses into Envoy. A panic is caught,
//! counted in [`PANICS`], logged, and the request answered by the failure mode.

#![allow(unsafe_code, missing_docs)]

use std::borrow::Cow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::abi::{
    self, ConfigEnvoyPtr, ConfigModulePtr, EnvoyBuffer, EnvoyHttpHeader, FilterEnvoyPtr,
    FilterModulePtr,
};
use crate::config::Configured;
use crate::envoy::{self, Config, Filter};
use crate::spares;
use crate::stream::{self, Headers, Stream, Then};

mod unused;

/// Panics caught in the hooks, since the module was loaded.
pub static PANICS: AtomicU64 = AtomicU64::new(0);

/// Runs `body`, or, if it panics, counts and logs the panic and returns `fallback`.
fn guarded<T>(hook: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    guarded_with(
        |line| envoy::log(abi::LOG_ERROR, line),
        hook,
        fallback,
        body,
    )
}

/// [`guarded`], with the log line written by `log`.
fn guarded_with<T>(log: impl FnOnce(&str), hook: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(_) => {
            PANICS.fetch_add(1, Ordering::Relaxed);
            log(&format!("sluice: a panic in {hook} was caught"));
            fallback
        }
    }
}

/// The stream behind `ptr`.
///
/// Envoy calls one stream's hooks on one worker, but may call one from within another's call
/// into Envoy: letting a paused request go on or replying runs the filter chain on (a local
/// reply's response headers come inline), and a callout Envoy fails at once could be answered
/// inline, from within the post (Envoy 1.40 does not answer it). So a hook uses the stream
/// only while it runs the module's code: it lets a request go on or replies once done with it
/// ([`stream::carry_out`]), and leaves an inline callout answer alone ([`envoy::posting`]).
///
/// # Safety
/// `ptr` must be one `on_http_filter_new` returned and `on_http_filter_destroy` has not yet
/// freed, and no other reference to the stream may be in use while this one is.
unsafe fn stream<'a>(ptr: FilterModulePtr) -> Option<&'a mut Stream> {
    // SAFETY: the caller's promise; the pointer is a `Box<Stream>` leaked by `filter_new`.
    unsafe { (ptr as *mut Stream).as_mut() }
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const std::ffi::c_char {
    abi::ABI_VERSION.as_ptr()
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy: ConfigEnvoyPtr,
    _name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> ConfigModulePtr {
    guarded("on_http_filter_config_new", std::ptr::null(), || {
        // SAFETY: Envoy's buffer, valid for this hook.
        let json = unsafe { config.bytes() };
        match Configured::new(&Config(config_envoy), json) {
            Ok(configured) => Box::into_raw(Box::new(Arc::new(configured))) as ConfigModulePtr,
            Err(refused) => {
                // Envoy refuses the configuration (and will not start) on a null answer.
                envoy::log(abi::LOG_ERROR, &refused.0);
                std::ptr::null()
            }
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: ConfigModulePtr) {
    guarded("on_http_filter_config_destroy", (), || {
        if !config.is_null() {
            // SAFETY: the pointer `config_new` leaked, destroyed once by Envoy.
            let configured = unsafe { Box::from_raw(config as *mut Arc<Configured>) };
            configured.stop();
        }
    });
}

/// # Safety
/// Envoy passes a configuration `on_http_filter_config_new` made and not yet destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: ConfigModulePtr,
    _filter_envoy: FilterEnvoyPtr,
) -> FilterModulePtr {
    guarded("on_http_filter_new", std::ptr::null(), || {
        // SAFETY: a pointer `config_new` returned; Envoy keeps the configuration alive while
        // its filters are made.
        let Some(configured) = (unsafe { configured(config) }) else {
            return std::ptr::null();
        };
        Box::into_raw(spares::stream(configured)) as FilterModulePtr
    })
}

/// # Safety
/// Envoy passes a filter `on_http_filter_new` made and not yet destroyed (and, for a
/// callout, arrays of the sizes it gives, valid for the call).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    _end_of_stream: bool,
) -> u32 {
    // SAFETY: a live stream, the first of its hooks, called by Envoy from no other.
    let Some(stream) = (unsafe { stream(filter) }) else {
        return abi::CONTINUE;
    };
    let envoy = Filter(filter_envoy);
    let then = guarded("on_http_filter_request_headers", None, || {
        Some(stream.on_request_headers(envoy))
    })
    .unwrap_or_else(|| after_panic(stream, envoy));
    // Done with the stream: a reply calls its hooks again.
    match stream::carry_out(envoy, then, false) {
        Headers::Continue => abi::CONTINUE,
        Headers::Stop => abi::STOP_ALL_ITERATION_AND_WATERMARK,
    }
}

/// # Safety
/// Envoy passes a filter `on_http_filter_new` made and not yet destroyed (and, for a
/// callout, arrays of the sizes it gives, valid for the call).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    callout_id: u64,
    result: u32,
    headers: *const EnvoyHttpHeader,
    headers_size: usize,
    body_chunks: *const EnvoyBuffer,
    body_chunks_size: usize,
) {
    // An inline answer to a callout Envoy failed at once, from within the post (1.40 sends
    // none): the posting hook has the stream, and the post's error decides the request.
    if envoy::posting(filter_envoy) {
        return;
    }
    // SAFETY: a live stream; no hook of it runs (a callout's answer comes from Envoy's event
    // loop, or inline, which is passed over above).
    let Some(stream) = (unsafe { stream(filter) }) else {
        return;
    };
    let envoy = Filter(filter_envoy);
    let then = guarded("on_http_filter_http_callout_done", None, || {
        // SAFETY: Envoy's arrays of the sizes it gives, valid for this hook; null or empty
        // when the callout failed.
        let (headers, chunks) = unsafe {
            (
                slice(headers, headers_size),
                slice(body_chunks, body_chunks_size),
            )
        };
        // SAFETY: Envoy's buffers, valid for this hook.
        let answer = unsafe { callout_answer(result, headers, chunks) };
        Some(stream.on_callout_done(
            envoy,
            callout_id,
            answer.as_ref().map(|(s, b)| (*s, b.as_ref())),
        ))
    })
    .unwrap_or_else(|| after_panic(stream, envoy));
    // Done with the stream: going on or replying calls its hooks again.
    let _ = stream::carry_out(envoy, then, true);
}

/// A callout's answer: its status and body, or `None` when it failed (`result` not success, or
/// no headers).
///
/// # Safety
/// The headers' and chunks' buffers must be Envoy's, valid for the hook running.
unsafe fn callout_answer<'a>(
    result: u32,
    headers: &[EnvoyHttpHeader],
    chunks: &[EnvoyBuffer],
) -> Option<(&'a [u8], Cow<'a, [u8]>)> {
    if result != abi::CALLOUT_SUCCESS || headers.is_empty() {
        return None;
    }
    let status = headers
        .iter()
        // SAFETY: the caller's promise.
        .map(|h| unsafe { h.bytes() })
        .find_map(|(k, v)| (k == b":status").then_some(v))
        .unwrap_or_default();
    // SAFETY: the caller's promise. An answer is one chunk, read in place; several are joined.
    let body: Cow<'_, [u8]> = match chunks {
        [one] => Cow::Borrowed(unsafe { one.bytes() }),
        _ => Cow::Owned(chunks.iter().fold(Vec::new(), |mut body, c| {
            body.extend_from_slice(unsafe { c.bytes() });
            body
        })),
    };
    Some((status, body))
}

/// Decides by the failure mode a request whose hook panicked: it goes on, or gets the failure
/// denial.
fn after_panic(stream: &mut Stream, envoy: Filter) -> Then {
    let decided = guarded("the failure mode after a panic", None, || {
        Some(stream.decide_by_failure_mode(envoy))
    });
    // Should even that panic, the request goes on: a request left paused would hang.
    decided.unwrap_or(Then::GoOn)
}

/// `len` items at `ptr`, or none for a null pointer.
///
/// # Safety
/// A non-null `ptr` must point at `len` initialised items, valid for `'a`.
unsafe fn slice<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if ptr.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// A held request's time has come (`hold`).
///
/// # Safety
/// Envoy passes a filter `on_http_filter_new` made and not yet destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _event_id: u64,
) {
    // A held request's stream has nothing more to decide: it goes on.
    let _ = stream::carry_out(Filter(filter_envoy), Then::GoOn, true);
}

/// # Safety
/// Envoy passes a filter `on_http_filter_new` made and not yet destroyed (and, for a
/// callout, arrays of the sizes it gives, valid for the call).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    _end_of_stream: bool,
) -> u32 {
    // SAFETY: a live stream; the hooks that run this one inline (by a reply, or a request let
    // go on) are done with it (see `stream`).
    if let Some(stream) = unsafe { stream(filter) } {
        guarded("on_http_filter_response_headers", (), || {
            stream.on_response_headers(Filter(filter_envoy));
        });
    }
    abi::CONTINUE
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(filter: FilterModulePtr) {
    guarded("on_http_filter_destroy", (), || {
        if !filter.is_null() {
            // SAFETY: the pointer `filter_new` leaked, destroyed once by Envoy; Envoy calls
            // none of the stream's hooks after this one.
            spares::keep(unsafe { Box::from_raw(filter as *mut Stream) });
        }
    });
}

/// The configuration behind `ptr`.
///
/// # Safety
/// `ptr` must be one `on_http_filter_config_new` returned and `on_http_filter_config_destroy`
/// has not yet freed.
unsafe fn configured<'a>(ptr: ConfigModulePtr) -> Option<&'a Arc<Configured>> {
    // SAFETY: the caller's promise; the pointer is a `Box<Arc<Configured>>` leaked by
    // `config_new`.
    unsafe { (ptr as *const Arc<Configured>).as_ref() }
}

/// The leases' tick, which their thread scheduled (`crate::lease`), on the main thread.
///
/// # Safety
/// Envoy passes a configuration `on_http_filter_config_new` made and not yet destroyed: it
/// schedules a configuration's hook only while the configuration lives.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    config_envoy: ConfigEnvoyPtr,
    config: ConfigModulePtr,
    _event_id: u64,
) {
    guarded("on_http_filter_config_scheduled", (), || {
        // SAFETY: the caller's promise.
        if let Some(configured) = unsafe { configured(config) } {
            configured.on_lease_tick(&Config(config_envoy));
        }
    });
}

/// A lease call's answer, on the main thread.
///
/// # Safety
/// Envoy passes a configuration `on_http_filter_config_new` made and not yet destroyed, and
/// arrays of the sizes it gives, valid for the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    config_envoy: ConfigEnvoyPtr,
    config: ConfigModulePtr,
    callout_id: u64,
    result: u32,
    headers: *const EnvoyHttpHeader,
    headers_size: usize,
    body_chunks: *const EnvoyBuffer,
    body_chunks_size: usize,
) {
    guarded("on_http_filter_config_http_callout_done", (), || {
        // SAFETY: the caller's promise.
        let Some(configured) = (unsafe { configured(config) }) else {
            return;
        };
        // SAFETY: Envoy's arrays of the sizes it gives, valid for this hook, and the buffers
        // in them.
        let answer = unsafe {
            callout_answer(
                result,
                slice(headers, headers_size),
                slice(body_chunks, body_chunks_size),
            )
        };
        configured.on_lease_answer(
            &Config(config_envoy),
            callout_id,
            answer.as_ref().map(|(s, b)| (*s, b.as_ref())),
        );
    });
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::{PANICS, guarded_with};

    #[test]
    fn a_panic_in_a_hook_is_caught_counted_and_answered_with_the_fallback() {
        let before = PANICS.load(Ordering::Relaxed);
        // Quietly: the default hook would print the panic as if the test failed.
        std::panic::set_hook(Box::new(|_| {}));
        let mut logged = String::new();
        let answer = guarded_with(
            |line| logged = line.to_owned(),
            "a test hook",
            7,
            || -> u32 { panic!("a bug") },
        );
        let _ = std::panic::take_hook();
        assert_eq!(answer, 7);
        assert_eq!(PANICS.load(Ordering::Relaxed), before + 1);
        assert_eq!(logged, "sluice: a panic in a test hook was caught");
        let answer = guarded_with(|_| panic!("nothing to log"), "a test hook", 7, || 3);
        assert_eq!(answer, 3, "no panic, its own answer");
    }
}
