//! The host calls the SDK wraps in a way sluice cannot use as is.
//!
//! - `proxy_set_property`: the SDK ends every path segment with a NUL, and Envoy stores filter
//!   state under `"wasm." + path` byte for byte, so the SDK would store `wasm.sluice.decision\0`,
//!   a key no access log can name. We pass the path's bytes exactly.
//! - `proxy_get_property`, read on every request: the SDK builds the path anew each call and
//!   panics on a status it does not expect; here the path is a constant and any failure is
//!   `None`.
//! - `proxy_set_effective_context` and `proxy_continue_stream`, called from the root context's
//!   tick for streams that may have ended meanwhile: the SDK panics on any status it does not
//!   expect, and a panic traps the worker's VM. These report the status instead.

#![allow(unsafe_code)]

#[link(wasm_import_module = "env")]
unsafe extern "C" {
    fn proxy_set_property(
        path_data: *const u8,
        path_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
    fn proxy_continue_stream(stream_type: u32) -> u32;
}

/// `Ok` in the ABI.
const OK: u32 = 0;
/// `StreamType::HttpRequest` in the ABI.
const HTTP_REQUEST: u32 = 0;

/// `source.address` as a property path: segments separated by NUL.
pub const SOURCE_ADDRESS: &[u8] = b"source\0address";

/// The value of property `path` (segments separated by NUL), or `None` when the host has none
/// or refused.
pub fn get_property(path: &[u8]) -> Option<Vec<u8>> {
    let mut data: *mut u8 = std::ptr::null_mut();
    let mut size: usize = 0;
    // SAFETY: the path is a live slice the host only reads; the host writes the two out
    // pointers, which point at live locals.
    let status = unsafe { proxy_get_property(path.as_ptr(), path.len(), &mut data, &mut size) };
    if status != OK || data.is_null() {
        return None;
    }
    // SAFETY: on success the host returns memory it obtained from this module's
    // `proxy_on_memory_allocate` (the SDK's, a `Vec<u8>` of exactly `size` bytes), which is
    // now ours to own, as the SDK's own getters take it.
    Some(unsafe { Vec::from_raw_parts(data, size, size) })
}

/// Sets filter state `path` (one segment, no NUL) on the current stream. Returns whether the
/// host accepted it.
pub fn set_filter_state(path: &str, value: &[u8]) -> bool {
    // SAFETY: both pointers and lengths describe live slices for the duration of the call;
    // the host only reads them.
    unsafe { proxy_set_property(path.as_ptr(), path.len(), value.as_ptr(), value.len()) == OK }
}

/// Makes `context_id` the context later host calls act on; false if the host no longer knows
/// it (the stream has ended).
pub fn set_effective_context(context_id: u32) -> bool {
    // SAFETY: a plain integer call.
    unsafe { proxy_set_effective_context(context_id) == OK }
}

/// Resumes the current stream's request; false if the host refused.
pub fn resume_request() -> bool {
    // SAFETY: a plain integer call.
    unsafe { proxy_continue_stream(HTTP_REQUEST) == OK }
}
