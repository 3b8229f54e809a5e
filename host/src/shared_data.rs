//! Shared data and shared queues: `proxy_{get,set}_shared_data`,
//! `proxy_{register,resolve,enqueue,dequeue}_shared_queue`.
//!
//! As in Envoy's host: data is process-wide per `vm_id`, so every worker's VM of one Envoy sees
//! it; CAS values come from one counter starting at 1; a CAS of 0 writes unconditionally; a
//! mismatch is reported only when the key exists with another CAS; an absent key is
//! `NotFound`.

use std::collections::VecDeque;

use wasmtime::{Caller, Linker};

use super::abi::Status;
use super::memory::{self, HostResult, finish, or_status, status};
use super::state::HostState;

fn get(
    mut caller: Caller<'_, HostState>,
    key_ptr: i32,
    key_len: i32,
    ptr_ptr: i32,
    size_ptr: i32,
    cas_ptr: i32,
) -> HostResult {
    let found = or_status!(memory::with_bytes(
        &mut caller,
        key_ptr,
        key_len,
        |key, state| Ok(state.shared.get(&state.info.vm_id, key))
    ));
    let Some((value, cas)) = found else {
        return status(Status::NotFound);
    };
    finish(
        memory::give(&mut caller, &value, ptr_ptr, size_ptr)
            .map(|r| r.and_then(|()| memory::write_u32(&mut caller, cas_ptr, cas))),
    )
}

fn set(
    mut caller: Caller<'_, HostState>,
    key_ptr: i32,
    key_len: i32,
    value_ptr: i32,
    value_len: i32,
    cas: i32,
) -> HostResult {
    let (key, value) = or_status!(memory::read_two(
        &mut caller,
        (key_ptr, key_len),
        (value_ptr, value_len)
    ));
    let state = caller.data();
    status(
        state
            .shared
            .set(&state.info.vm_id, &key, &value, cas as u32),
    )
}

fn register_queue(
    mut caller: Caller<'_, HostState>,
    name_ptr: i32,
    name_len: i32,
    token_ptr: i32,
) -> HostResult {
    let name = or_status!(memory::read(&mut caller, name_ptr, name_len));
    let state = caller.data();
    let token = state.shared.register_queue(&state.info.vm_id, &name);
    finish(Ok(memory::write_u32(&mut caller, token_ptr, token)))
}

fn resolve_queue(
    mut caller: Caller<'_, HostState>,
    vm_ptr: i32,
    vm_len: i32,
    name_ptr: i32,
    name_len: i32,
    token_ptr: i32,
) -> HostResult {
    let (vm_id, name) = or_status!(memory::read_two(
        &mut caller,
        (vm_ptr, vm_len),
        (name_ptr, name_len)
    ));
    match caller.data().shared.resolve_queue(&vm_id, &name) {
        Some(token) => finish(Ok(memory::write_u32(&mut caller, token_ptr, token))),
        None => status(Status::NotFound),
    }
}

fn enqueue(mut caller: Caller<'_, HostState>, token: i32, ptr: i32, len: i32) -> HostResult {
    let value = or_status!(memory::read(&mut caller, ptr, len));
    match caller
        .data()
        .shared
        .with_queue(token as u32, |q| q.push_back(value))
    {
        Some(()) => status(Status::Ok),
        None => status(Status::NotFound),
    }
}

fn dequeue(
    mut caller: Caller<'_, HostState>,
    token: i32,
    ptr_ptr: i32,
    size_ptr: i32,
) -> HostResult {
    match caller
        .data()
        .shared
        .with_queue(token as u32, VecDeque::pop_front)
    {
        None => status(Status::NotFound),
        Some(None) => status(Status::Empty),
        Some(Some(value)) => finish(memory::give(&mut caller, &value, ptr_ptr, size_ptr)),
    }
}

/// Adds the shared data and queue host calls.
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_get_shared_data", get)?;
    linker.func_wrap("env", "proxy_set_shared_data", set)?;
    linker.func_wrap("env", "proxy_register_shared_queue", register_queue)?;
    linker.func_wrap("env", "proxy_resolve_shared_queue", resolve_queue)?;
    linker.func_wrap("env", "proxy_enqueue_shared_queue", enqueue)?;
    linker.func_wrap("env", "proxy_dequeue_shared_queue", dequeue)?;
    Ok(())
}
