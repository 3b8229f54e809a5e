//! Stream control, contexts, time and the calls sluice's host does not serve.
//!
//! `proxy_continue_stream`, `proxy_close_stream` and `proxy_send_local_response` only record
//! what was asked: as in Envoy they take effect after the running callback returns.
//! `proxy_set_effective_context` redirects the host calls that follow within the same callback.

use wasmtime::{Caller, FuncType, Linker, Val, ValType};

use super::abi::{Status, decode_pairs};
use super::memory::{self, HostResult, finish, status};
use super::state::{HostState, LocalReply, MapAccess, StreamAction};

fn push_action(caller: &mut Caller<'_, HostState>, action: StreamAction) -> HostResult {
    match caller.data_mut().target_stream() {
        Some(stream) => {
            stream.actions.push(action);
            status(Status::Ok)
        }
        // The root context has no stream to continue.
        None => status(Status::NotFound),
    }
}

fn continue_stream(mut caller: Caller<'_, HostState>, kind: i32) -> HostResult {
    match kind {
        0 => {
            // The request goes on once the callback returns, but Envoy lets go of its headers at
            // once (`request_headers_ = nullptr`): a read later in the same callback is
            // BadArgument (seen in Envoy 1.40).
            if let Some(stream) = caller.data_mut().target_stream() {
                stream.request_access = MapAccess::Unavailable;
            }
            push_action(&mut caller, StreamAction::ContinueRequest)
        }
        1 => push_action(&mut caller, StreamAction::ContinueResponse),
        2 | 3 => status(Status::Ok),
        _ => status(Status::BadArgument),
    }
}

fn close_stream(mut caller: Caller<'_, HostState>, kind: i32) -> HostResult {
    match kind {
        0 | 1 => push_action(&mut caller, StreamAction::Reset),
        2 | 3 => status(Status::Ok),
        _ => status(Status::BadArgument),
    }
}

#[allow(clippy::too_many_arguments)]
fn send_local_response(
    mut caller: Caller<'_, HostState>,
    code: i32,
    details_ptr: i32,
    details_len: i32,
    body_ptr: i32,
    body_len: i32,
    headers_ptr: i32,
    headers_len: i32,
    _grpc_status: i32,
) -> HostResult {
    let parts = (|| {
        Ok::<_, Status>((
            memory::read(&mut caller, details_ptr, details_len)?,
            memory::read(&mut caller, body_ptr, body_len)?,
            memory::read(&mut caller, headers_ptr, headers_len)?,
        ))
    })();
    let (details, body, headers) = match parts {
        Ok(p) => p,
        Err(s) => return status(s),
    };
    let reply = LocalReply {
        status: code as u32,
        // Envoy's Context::sendLocalResponse: StringUtil::replaceAllEmptySpace.
        details: String::from_utf8_lossy(&details)
            .chars()
            .map(|c| match c {
                ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r' => '_',
                c => c,
            })
            .collect(),
        body,
        headers: decode_pairs(&headers)
            .into_iter()
            .map(|(k, v)| (String::from_utf8_lossy(k).to_ascii_lowercase(), v.to_vec()))
            .collect(),
    };
    push_action(&mut caller, StreamAction::LocalReply(reply))
}

fn set_effective_context(mut caller: Caller<'_, HostState>, context_id: i32) -> HostResult {
    let id = context_id as u32;
    let state = caller.data_mut();
    if id == state.contexts.root || state.streams.contains_key(&id) {
        state.contexts.effective = Some(id);
        status(Status::Ok)
    } else {
        status(Status::BadArgument)
    }
}

fn set_tick_period(mut caller: Caller<'_, HostState>, period_ms: i32) -> HostResult {
    // Every context's timer is its root context's.
    caller.data_mut().tick_period_ms = period_ms as u32;
    status(Status::Ok)
}

fn get_current_time(mut caller: Caller<'_, HostState>, time_ptr: i32) -> HostResult {
    let now = caller.data().now_ns;
    finish(Ok(memory::write_u64(&mut caller, time_ptr, now)))
}

fn get_status(
    mut caller: Caller<'_, HostState>,
    code_ptr: i32,
    ptr_ptr: i32,
    size_ptr: i32,
) -> HostResult {
    // The root context's: the simulator makes no gRPC calls, so only a failed callout sets it.
    let (code, message) = caller.data().callouts.status;
    if let Err(s) = memory::write_u32(&mut caller, code_ptr, code) {
        return status(s);
    }
    finish(memory::give(
        &mut caller,
        message.as_bytes(),
        ptr_ptr,
        size_ptr,
    ))
}

fn call_foreign_function(
    mut caller: Caller<'_, HostState>,
    name_ptr: i32,
    name_len: i32,
    _args_ptr: i32,
    _args_len: i32,
    _res_ptr: i32,
    _res_len: i32,
) -> HostResult {
    let name = match memory::read(&mut caller, name_ptr, name_len) {
        Ok(n) => String::from_utf8_lossy(&n).into_owned(),
        Err(s) => return status(s),
    };
    caller.data().logs.write(
        super::log_sink::Level::Debug,
        format!("foreign function `{name}` is not registered in this host"),
    );
    status(Status::NotFound)
}

fn grpc_unavailable(caller: &Caller<'_, HostState>, call: &str) -> HostResult {
    caller.data().logs.write(
        super::log_sink::Level::Warn,
        format!("{call}: the simulator has no gRPC client"),
    );
    status(Status::InternalFailure)
}

/// Adds stream control, contexts, time, and the gRPC and foreign-function calls.
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_continue_stream", continue_stream)?;
    linker.func_wrap("env", "proxy_close_stream", close_stream)?;
    linker.func_wrap("env", "proxy_send_local_response", send_local_response)?;
    linker.func_wrap("env", "proxy_set_effective_context", set_effective_context)?;
    // WasmBase::done: only a root context whose `on_done` answered "not yet" may call it, and
    // the simulator never shuts a VM down, so no context is ever pending.
    linker.func_wrap("env", "proxy_done", |_: Caller<'_, HostState>| {
        status(Status::NotFound)
    })?;
    linker.func_wrap("env", "proxy_set_tick_period_milliseconds", set_tick_period)?;
    linker.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        get_current_time,
    )?;
    linker.func_wrap("env", "proxy_get_status", get_status)?;
    linker.func_wrap("env", "proxy_call_foreign_function", call_foreign_function)?;
    // gRPC calls take only i32s and answer a status; the simulator has no gRPC client.
    for (name, params) in [
        ("proxy_grpc_call", 12),
        ("proxy_grpc_stream", 9),
        ("proxy_grpc_send", 4),
    ] {
        let ty = FuncType::new(linker.engine(), vec![ValType::I32; params], [ValType::I32]);
        linker.func_new("env", name, ty, move |caller, _params, results| {
            results[0] = Val::I32(grpc_unavailable(&caller, name)?);
            Ok(())
        })?;
    }
    linker.func_wrap(
        "env",
        "proxy_grpc_cancel",
        |_: Caller<'_, HostState>, _: i32| status(Status::NotFound),
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_close",
        |_: Caller<'_, HostState>, _: i32| status(Status::NotFound),
    )?;
    // Emscripten's two imports, which Envoy's host provides too.
    linker.func_wrap(
        "env",
        "pthread_equal",
        |_: Caller<'_, HostState>, a: i32, b: i32| i32::from(a == b),
    )?;
    linker.func_wrap(
        "env",
        "emscripten_notify_memory_growth",
        |_: Caller<'_, HostState>, _: i32| {},
    )?;
    Ok(())
}
