//! The proxy-wasm 0.2.1 host calls, imported raw so that every status the host answers reaches
//! the script (the SDK would panic on the ones it does not expect, which is what the fidelity
//! tests need to see).

#![allow(unsafe_code)] // the ABI is a C ABI; every call below passes live buffers only

#[link(wasm_import_module = "env")]
unsafe extern "C" {
    fn proxy_log(level: u32, ptr: *const u8, len: usize) -> u32;
    fn proxy_get_property(
        path: *const u8,
        len: usize,
        out: *mut *mut u8,
        out_len: *mut usize,
    ) -> u32;
    fn proxy_set_property(path: *const u8, len: usize, value: *const u8, value_len: usize) -> u32;
    fn proxy_get_header_map_pairs(map: u32, out: *mut *mut u8, out_len: *mut usize) -> u32;
    fn proxy_get_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        out: *mut *mut u8,
        out_len: *mut usize,
    ) -> u32;
    fn proxy_add_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> u32;
    fn proxy_get_header_map_size(map: u32, out: *mut usize) -> u32;
    fn proxy_get_buffer_bytes(
        buffer: u32,
        start: usize,
        max: usize,
        out: *mut *mut u8,
        out_len: *mut usize,
    ) -> u32;
    fn proxy_http_call(
        upstream: *const u8,
        upstream_len: usize,
        headers: *const u8,
        headers_len: usize,
        body: *const u8,
        body_len: usize,
        trailers: *const u8,
        trailers_len: usize,
        timeout_ms: u32,
        token: *mut u32,
    ) -> u32;
    fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_len: usize,
        body: *const u8,
        body_len: usize,
        headers: *const u8,
        headers_len: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_continue_stream(stream: u32) -> u32;
    fn proxy_close_stream(stream: u32) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_shared_data(
        key: *const u8,
        key_len: usize,
        out: *mut *mut u8,
        out_len: *mut usize,
        cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
        cas: u32,
    ) -> u32;
    fn proxy_define_metric(kind: u32, name: *const u8, name_len: usize, id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_record_metric(id: u32, value: u64) -> u32;
    fn proxy_get_metric(id: u32, value: *mut u64) -> u32;
    fn proxy_get_current_time_nanoseconds(time: *mut u64) -> u32;
    fn proxy_set_effective_context(context: u32) -> u32;
    fn proxy_get_status(code: *mut u32, message: *mut *mut u8, message_len: *mut usize) -> u32;
    fn proxy_done() -> u32;
    fn proxy_grpc_call(
        service: *const u8,
        service_len: usize,
        service_name: *const u8,
        service_name_len: usize,
        method: *const u8,
        method_len: usize,
        metadata: *const u8,
        metadata_len: usize,
        message: *const u8,
        message_len: usize,
        timeout_ms: u32,
        token: *mut u32,
    ) -> u32;
    fn proxy_register_shared_queue(name: *const u8, name_len: usize, id: *mut u32) -> u32;
    fn proxy_resolve_shared_queue(
        vm_id: *const u8,
        vm_id_len: usize,
        name: *const u8,
        name_len: usize,
        id: *mut u32,
    ) -> u32;
    fn proxy_enqueue_shared_queue(id: u32, value: *const u8, value_len: usize) -> u32;
}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
unsafe extern "C" {
    fn random_get(buf: *mut u8, len: usize) -> u16;
}

/// A status and, when there is one, what the call returned.
pub type Answer<T> = (u32, Option<T>);

/// Memory the host filled through `proxy_on_memory_allocate`, taken back.
fn take(ptr: *mut u8, len: usize) -> Vec<u8> {
    if ptr.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: the host allocated exactly `len` bytes through `proxy_on_memory_allocate`
    // (a `Vec<u8>` of that capacity, forgotten) and filled them.
    unsafe { Vec::from_raw_parts(ptr, len, len) }
}

fn bytes_out(call: impl FnOnce(*mut *mut u8, *mut usize) -> u32) -> Answer<Vec<u8>> {
    let mut ptr: *mut u8 = std::ptr::null_mut();
    let mut len: usize = 0;
    let status = call(&mut ptr, &mut len);
    (status, (status == 0).then(|| take(ptr, len)))
}

/// Logs `message` at `level`; the host's status.
pub fn log(level: u32, message: &str) -> u32 {
    // SAFETY: a live buffer, read by the host during the call.
    unsafe { proxy_log(level, message.as_ptr(), message.len()) }
}

/// `proxy_grpc_call` to `cluster` (named, not a serialized GrpcService), with no metadata and
/// an empty message.
pub fn grpc_call(cluster: &str, service: &str, method: &str, timeout_ms: u32) -> Answer<u32> {
    let mut token = 0u32;
    let metadata = encode_pairs(&[]);
    // SAFETY: live buffers, read during the call; the host writes the token.
    let status = unsafe {
        proxy_grpc_call(
            cluster.as_ptr(),
            cluster.len(),
            service.as_ptr(),
            service.len(),
            method.as_ptr(),
            method.len(),
            metadata.as_ptr(),
            metadata.len(),
            std::ptr::null(),
            0,
            timeout_ms,
            &mut token,
        )
    };
    (status, (status == 0).then_some(token))
}

/// `proxy_register_shared_queue`: the status and the queue's id.
pub fn register_queue(name: &str) -> Answer<u32> {
    let mut id = 0u32;
    // SAFETY: a live buffer, read during the call; the host writes the id.
    let status = unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) };
    (status, (status == 0).then_some(id))
}

/// `proxy_resolve_shared_queue` of this VM's id, then `proxy_enqueue_shared_queue`: the
/// statuses of both.
pub fn enqueue(vm_id: &str, name: &str, value: &str) -> (u32, u32) {
    let mut id = 0u32;
    // SAFETY: live buffers, read during the calls; the host writes the id.
    unsafe {
        let resolved = proxy_resolve_shared_queue(
            vm_id.as_ptr(),
            vm_id.len(),
            name.as_ptr(),
            name.len(),
            &mut id,
        );
        if resolved != 0 {
            return (resolved, u32::MAX);
        }
        (
            0,
            proxy_enqueue_shared_queue(id, value.as_ptr(), value.len()),
        )
    }
}

/// WASI `random_get` of `len` bytes: its errno and the bytes.
pub fn random(len: usize) -> (u16, Vec<u8>) {
    let mut buf = vec![0u8; len];
    // SAFETY: a live buffer of `len` bytes, written by the host during the call.
    let errno = unsafe { random_get(buf.as_mut_ptr(), len) };
    (errno, buf)
}

/// `proxy_get_property`; `path` is already NUL-joined.
pub fn get_property(path: &[u8]) -> Answer<Vec<u8>> {
    // SAFETY: live buffers; the host writes the two out-parameters.
    bytes_out(|p, l| unsafe { proxy_get_property(path.as_ptr(), path.len(), p, l) })
}

/// `proxy_set_property`.
pub fn set_property(path: &[u8], value: &[u8]) -> u32 {
    // SAFETY: live buffers, read during the call.
    unsafe { proxy_set_property(path.as_ptr(), path.len(), value.as_ptr(), value.len()) }
}

/// `proxy_get_header_map_pairs`, raw.
pub fn header_pairs(map: u32) -> Answer<Vec<u8>> {
    // SAFETY: the host writes the two out-parameters.
    bytes_out(|p, l| unsafe { proxy_get_header_map_pairs(map, p, l) })
}

/// `proxy_get_header_map_value`.
pub fn header_value(map: u32, name: &str) -> Answer<Vec<u8>> {
    // SAFETY: live buffers; the host writes the two out-parameters.
    bytes_out(|p, l| unsafe { proxy_get_header_map_value(map, name.as_ptr(), name.len(), p, l) })
}

/// `proxy_add_header_map_value`.
pub fn add_header(map: u32, name: &str, value: &str) -> u32 {
    // SAFETY: live buffers, read during the call.
    unsafe {
        proxy_add_header_map_value(map, name.as_ptr(), name.len(), value.as_ptr(), value.len())
    }
}

/// `proxy_get_header_map_size`.
pub fn header_map_size(map: u32) -> Answer<usize> {
    let mut size = 0usize;
    // SAFETY: the host writes one out-parameter.
    let status = unsafe { proxy_get_header_map_size(map, &mut size) };
    (status, (status == 0).then_some(size))
}

/// `proxy_get_buffer_bytes` of the whole buffer.
pub fn buffer(kind: u32) -> Answer<Vec<u8>> {
    // SAFETY: the host writes the two out-parameters.
    bytes_out(|p, l| unsafe { proxy_get_buffer_bytes(kind, 0, usize::MAX >> 1, p, l) })
}

/// `proxy_http_call`; returns the token.
pub fn http_call(cluster: &str, headers: &[u8], body: &[u8], timeout_ms: u32) -> Answer<u32> {
    let mut token = 0u32;
    // SAFETY: live buffers, read during the call; the host writes the token.
    let status = unsafe {
        proxy_http_call(
            cluster.as_ptr(),
            cluster.len(),
            headers.as_ptr(),
            headers.len(),
            body.as_ptr(),
            body.len(),
            std::ptr::null(),
            0,
            timeout_ms,
            &mut token,
        )
    };
    (status, (status == 0).then_some(token))
}

/// `proxy_send_local_response`.
pub fn local_response(status: u32, details: &str, body: &[u8], headers: &[u8]) -> u32 {
    // SAFETY: live buffers, read during the call.
    unsafe {
        proxy_send_local_response(
            status,
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    }
}

/// `proxy_continue_stream`.
pub fn continue_stream(stream: u32) -> u32 {
    // SAFETY: an integer call.
    unsafe { proxy_continue_stream(stream) }
}

/// `proxy_close_stream`.
pub fn close_stream(stream: u32) -> u32 {
    // SAFETY: an integer call.
    unsafe { proxy_close_stream(stream) }
}

/// `proxy_set_tick_period_milliseconds`.
pub fn set_tick_period(ms: u32) -> u32 {
    // SAFETY: an integer call.
    unsafe { proxy_set_tick_period_milliseconds(ms) }
}

/// `proxy_get_shared_data`: the value and its CAS.
pub fn shared_get(key: &str) -> Answer<(Vec<u8>, u32)> {
    let mut cas = 0u32;
    let (status, value) =
        // SAFETY: live buffers; the host writes the three out-parameters.
        bytes_out(|p, l| unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), p, l, &mut cas) });
    (status, value.map(|v| (v, cas)))
}

/// `proxy_set_shared_data`.
pub fn shared_set(key: &str, value: &[u8], cas: u32) -> u32 {
    // SAFETY: live buffers, read during the call.
    unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas) }
}

/// `proxy_define_metric`.
pub fn define_metric(kind: u32, name: &str) -> Answer<u32> {
    let mut id = 0u32;
    // SAFETY: a live buffer; the host writes the id.
    let status = unsafe { proxy_define_metric(kind, name.as_ptr(), name.len(), &mut id) };
    (status, (status == 0).then_some(id))
}

/// `proxy_increment_metric`.
pub fn increment_metric(id: u32, offset: i64) -> u32 {
    // SAFETY: an integer call.
    unsafe { proxy_increment_metric(id, offset) }
}

/// `proxy_record_metric`.
pub fn record_metric(id: u32, value: u64) -> u32 {
    // SAFETY: an integer call.
    unsafe { proxy_record_metric(id, value) }
}

/// `proxy_get_metric`.
pub fn get_metric(id: u32) -> Answer<u64> {
    let mut value = 0u64;
    // SAFETY: the host writes one out-parameter.
    let status = unsafe { proxy_get_metric(id, &mut value) };
    (status, (status == 0).then_some(value))
}

/// `proxy_get_current_time_nanoseconds`.
pub fn now_ns() -> Answer<u64> {
    let mut now = 0u64;
    // SAFETY: the host writes one out-parameter.
    let status = unsafe { proxy_get_current_time_nanoseconds(&mut now) };
    (status, (status == 0).then_some(now))
}

/// `proxy_set_effective_context`.
pub fn set_effective_context(context: u32) -> u32 {
    // SAFETY: an integer call.
    unsafe { proxy_set_effective_context(context) }
}

/// `proxy_get_status`: the code and message of the root context's last failed call.
pub fn get_status() -> (u32, u32, Option<Vec<u8>>) {
    let mut code = 0u32;
    // SAFETY: the host writes the three out-parameters.
    let (status, message) = bytes_out(|p, l| unsafe { proxy_get_status(&mut code, p, l) });
    (status, code, message)
}

/// `proxy_done`.
pub fn done() -> u32 {
    // SAFETY: a call without arguments.
    unsafe { proxy_done() }
}

/// A serialized header map: count, (key length, value length) per pair, then each key and value
/// followed by a NUL; little-endian.
pub fn encode_pairs(pairs: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// The pairs of a serialized header map, lossily as text; `None` if it is malformed.
pub fn decode_pairs(bytes: &[u8]) -> Option<Vec<(String, String)>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let word = |at: usize| -> Option<usize> {
        let b = bytes.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let count = word(0)?;
    let mut data = 4 + count * 8;
    let mut pairs = Vec::with_capacity(count);
    for i in 0..count {
        let (k, v) = (word(4 + i * 8)?, word(8 + i * 8)?);
        let key = bytes.get(data..data + k)?;
        data += k + 1;
        let value = bytes.get(data..data + v)?;
        data += v + 1;
        pairs.push((
            String::from_utf8_lossy(key).into_owned(),
            String::from_utf8_lossy(value).into_owned(),
        ));
    }
    Some(pairs)
}
