//! sluice-probe: a proxy-wasm module for the simulator's fidelity tests.
//!
//! It uses no SDK: it exports the ABI's callbacks itself and imports the host calls raw, so it
//! sees exactly what a host passes and answers. In each callback it runs the steps its
//! configuration's script gives ([`script`]), and logs, one JSON object per line at info:
//! `{"event": "enter", "cb", "ctx", "args"}` when a callback starts, `{"event": "op", "op",
//! "status", ...}` for each step, `{"event": "leave", "cb", "ctx"}` when it returns. The tests
//! read those lines from the simulated Envoy's log.
//!
//! The script comes from the VM configuration in `on_vm_start` and from the plugin
//! configuration in `on_configure` (either may be empty).

#![allow(unsafe_code)] // the exports below are the ABI; `abi` holds the imports
#![allow(missing_docs)] // a test module: the crate doc says what it does

mod abi;
mod ops;
mod script;
mod state;

use serde_json::{Value, json};

use crate::script::Script;
use crate::state::with;

/// Logs one event.
fn emit(mut event: Value, cb: &str, ctx: u32) {
    if let Value::Object(fields) = &mut event {
        fields.insert("cb".into(), cb.into());
        fields.insert("ctx".into(), ctx.into());
    }
    abi::log(2, &event.to_string());
}

/// Runs callback `cb` for context `ctx`: logs it, runs its steps, logs its end.
fn callback(cb: &str, ctx: u32, args: &[u64]) {
    let (initialized, ordinal) = with(|p| (p.initialized, p.streams.get(&ctx).copied()));
    emit(
        json!({"event": "enter", "args": args, "initialized": initialized, "stream": ordinal}),
        cb,
        ctx,
    );
    let steps = with(|p| p.script.steps(cb).to_vec());
    for step in steps {
        if step.stream.is_some() && step.stream != ordinal {
            continue;
        }
        let mut result = ops::run(&step.op);
        if let Value::Object(fields) = &mut result {
            fields.insert("event".into(), "op".into());
        }
        emit(result, cb, ctx);
    }
}

fn leave(cb: &str, ctx: u32, returned: u32) -> u32 {
    emit(json!({"event": "leave", "returned": returned}), cb, ctx);
    returned
}

fn load_script(buffer: u32) {
    let (status, bytes) = abi::buffer(buffer);
    let Some(bytes) = bytes.filter(|b| !b.is_empty()) else {
        emit(
            json!({"event": "script", "buffer": buffer, "status": status, "bytes": 0}),
            "load",
            0,
        );
        return;
    };
    match serde_json::from_slice::<Script>(&bytes) {
        Ok(script) => {
            with(|p| p.script = script);
            emit(
                json!({"event": "script", "buffer": buffer, "bytes": bytes.len()}),
                "load",
                0,
            );
        }
        Err(e) => emit(
            json!({"event": "script", "buffer": buffer, "error": e.to_string()}),
            "load",
            0,
        ),
    }
}

#[cfg(target_os = "wasi")]
unsafe extern "C" {
    fn __wasm_call_ctors();
}

#[unsafe(no_mangle)]
pub extern "C" fn _initialize() {
    #[cfg(target_os = "wasi")]
    // SAFETY: the static constructors run once, first, as a reactor's start-up must.
    unsafe {
        __wasm_call_ctors();
    }
    let already = with(|p| std::mem::replace(&mut p.initialized, true));
    emit(
        json!({"event": "initialize", "again": already}),
        "_initialize",
        0,
    );
}

#[unsafe(no_mangle)]
pub extern "C" fn proxy_abi_version_0_2_1() {}

#[unsafe(no_mangle)]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    let mut bytes: Vec<u8> = Vec::with_capacity(size);
    let ptr = bytes.as_mut_ptr();
    std::mem::forget(bytes);
    ptr
}

#[unsafe(no_mangle)]
pub extern "C" fn proxy_on_context_create(ctx: u32, parent: u32) {
    if parent != 0 {
        with(|p| {
            let ordinal = p.streams.len() as u32 + 1;
            p.streams.insert(ctx, ordinal);
            p.newest_stream = ctx;
        });
    }
    callback(
        "on_context_create",
        ctx,
        &[u64::from(ctx), u64::from(parent)],
    );
    leave("on_context_create", ctx, 0);
}

#[unsafe(no_mangle)]
pub extern "C" fn proxy_on_vm_start(root: u32, size: usize) -> u32 {
    let starts = with(|p| {
        p.vm_starts += 1;
        p.vm_starts
    });
    load_script(6);
    callback(
        "on_vm_start",
        root,
        &[u64::from(root), size as u64, u64::from(starts)],
    );
    let ok = with(|p| p.script.returns.on_vm_start.unwrap_or(true));
    leave("on_vm_start", root, u32::from(ok))
}

#[unsafe(no_mangle)]
pub extern "C" fn proxy_on_configure(root: u32, size: usize) -> u32 {
    load_script(7);
    callback("on_configure", root, &[u64::from(root), size as u64]);
    let ok = with(|p| p.script.returns.on_configure.unwrap_or(true));
    leave("on_configure", root, u32::from(ok))
}

#[unsafe(no_mangle)]
pub extern "C" fn proxy_on_request_headers(ctx: u32, headers: usize, end: u32) -> u32 {
    callback("on_request_headers", ctx, &[headers as u64, u64::from(end)]);
    let action = with(|p| {
        p.script
            .returns
            .on_request_headers
            .map_or(0, script::Action::abi)
    });
    leave("on_request_headers", ctx, action)
}

#[unsafe(no_mangle)]
pub extern "C" fn proxy_on_response_headers(ctx: u32, headers: usize, end: u32) -> u32 {
    callback(
        "on_response_headers",
        ctx,
        &[headers as u64, u64::from(end)],
    );
    let action = with(|p| {
        p.script
            .returns
            .on_response_headers
            .map_or(0, script::Action::abi)
    });
    leave("on_response_headers", ctx, action)
}

#[unsafe(no_mangle)]
pub extern "C" fn proxy_on_response_body(ctx: u32, size: usize, end: u32) -> u32 {
    callback("on_response_body", ctx, &[size as u64, u64::from(end)]);
    leave("on_response_body", ctx, 0)
}

#[unsafe(no_mangle)]
pub extern "C" fn proxy_on_log(ctx: u32) {
    callback("on_log", ctx, &[]);
    leave("on_log", ctx, 0);
}

#[unsafe(no_mangle)]
pub extern "C" fn proxy_on_done(ctx: u32) -> u32 {
    callback("on_done", ctx, &[]);
    leave("on_done", ctx, 1)
}

#[unsafe(no_mangle)]
pub extern "C" fn proxy_on_delete(ctx: u32) {
    callback("on_delete", ctx, &[]);
    leave("on_delete", ctx, 0);
}

#[unsafe(no_mangle)]
pub extern "C" fn proxy_on_tick(root: u32) {
    callback("on_tick", root, &[]);
    leave("on_tick", root, 0);
}

#[unsafe(no_mangle)]
pub extern "C" fn proxy_on_queue_ready(root: u32, queue: u32) {
    callback("on_queue_ready", root, &[u64::from(queue)]);
    leave("on_queue_ready", root, 0);
}

#[unsafe(no_mangle)]
pub extern "C" fn proxy_on_http_call_response(
    root: u32,
    token: u32,
    headers: usize,
    body: usize,
    trailers: usize,
) {
    callback(
        "on_http_call_response",
        root,
        &[
            u64::from(token),
            headers as u64,
            body as u64,
            trailers as u64,
        ],
    );
    leave("on_http_call_response", root, 0);
}
