//! Buffers: `proxy_get_buffer_bytes`, `proxy_get_buffer_status`, `proxy_set_buffer_bytes`.
//!
//! As in Envoy: HTTP bodies always exist (empty when there is none); the callout's body only
//! while its answer is delivered, and not at all for a reset; the plugin configuration only
//! during `on_configure`; the VM configuration always. Anything else is `NotFound`.

use wasmtime::{Caller, Linker};

use super::abi::{BufferType, Status};
use super::memory::{self, Access, HostResult, finish, or_status, status};
use super::state::HostState;

fn buffer(state: &mut HostState, kind: i32) -> Access<&[u8]> {
    let kind = BufferType::from_abi(kind).ok_or(Status::BadArgument)?;
    match kind {
        BufferType::RequestBody => Ok(&[]),
        BufferType::ResponseBody => Ok(state
            .target_stream()
            .map_or(&[][..], |s| s.response_body.as_slice())),
        BufferType::CalloutResponseBody => state
            .callouts
            .reply
            .as_ref()
            .and_then(|r| r.body.as_deref())
            .ok_or(Status::NotFound),
        BufferType::VmConfiguration => Ok(&state.info.vm_configuration),
        BufferType::PluginConfiguration if state.configuring => {
            Ok(&state.info.plugin_configuration)
        }
        _ => Err(Status::NotFound),
    }
}

fn get_bytes(
    mut caller: Caller<'_, HostState>,
    kind: i32,
    start: i32,
    length: i32,
    ptr_ptr: i32,
    size_ptr: i32,
) -> HostResult {
    let (start, length) = (start as u32 as usize, length as u32 as usize);
    if start.checked_add(length).is_none() {
        return status(Status::BadArgument);
    }
    finish(memory::give_held(
        &mut caller,
        |state| {
            let data = buffer(state, kind)?;
            let end = (start + length).min(data.len());
            Ok(data.get(start..end).unwrap_or_default())
        },
        ptr_ptr,
        size_ptr,
    ))
}

fn get_status(
    mut caller: Caller<'_, HostState>,
    kind: i32,
    length_ptr: i32,
    flags_ptr: i32,
) -> HostResult {
    let length = match buffer(caller.data_mut(), kind) {
        Ok(d) => d.len(),
        Err(s) => return status(s),
    };
    finish(Ok(memory::write_u32(
        &mut caller,
        length_ptr,
        length as u32,
    )
    .and_then(|()| memory::write_u32(&mut caller, flags_ptr, 0))))
}

fn set_bytes(
    mut caller: Caller<'_, HostState>,
    kind: i32,
    start: i32,
    length: i32,
    ptr: i32,
    size: i32,
) -> HostResult {
    let data = or_status!(memory::read(&mut caller, ptr, size));
    if BufferType::from_abi(kind) != Some(BufferType::ResponseBody) {
        // Only the response body is ever mutable in the simulated streams.
        return status(if BufferType::from_abi(kind).is_some() {
            Status::NotFound
        } else {
            Status::BadArgument
        });
    }
    let Some(stream) = caller.data_mut().target_stream() else {
        return status(Status::NotFound);
    };
    let body = &mut stream.response_body;
    let (start, length) = (start as u32 as usize, length as u32 as usize);
    // Envoy's Buffer::copyFrom: prepend, replace all, or append; nothing else.
    if start == 0 && length == 0 {
        body.splice(0..0, data);
    } else if start == 0 && length >= body.len() {
        *body = data;
    } else if start >= body.len() {
        body.extend_from_slice(&data);
    } else {
        return status(Status::BadArgument);
    }
    status(Status::Ok)
}

/// Adds the buffer host calls.
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_get_buffer_bytes", get_bytes)?;
    linker.func_wrap("env", "proxy_get_buffer_status", get_status)?;
    linker.func_wrap("env", "proxy_set_buffer_bytes", set_bytes)?;
    Ok(())
}
