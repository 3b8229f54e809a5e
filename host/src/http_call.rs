//! Callouts: `proxy_http_call`.
//!
//! As in Envoy: the callout belongs to the root context; a negative timeout, an unknown cluster
//! or a missing `:path`, `:method` or `:authority` is `BadArgument`; the token is written before
//! anything is sent; the answer never arrives during the call that made it. The Envoy instance
//! takes [`Callouts::outgoing`](super::state::Callouts) after each callback and sends them.

use wasmtime::{Caller, Linker};

use super::abi::{Status, decode_pairs};
use super::header_map::HeaderMap;
use super::memory::{self, HostResult, status};
use super::state::{HostState, OutgoingCallout};

#[allow(clippy::too_many_arguments)]
fn http_call(
    mut caller: Caller<'_, HostState>,
    upstream_ptr: i32,
    upstream_len: i32,
    headers_ptr: i32,
    headers_len: i32,
    body_ptr: i32,
    body_len: i32,
    trailers_ptr: i32,
    trailers_len: i32,
    timeout_ms: i32,
    token_ptr: i32,
) -> HostResult {
    let read = |caller: &mut Caller<'_, HostState>, p, l| memory::read(caller, p, l);
    // The headers are decoded in place. The trailers are only checked to lie in memory: the
    // callout the simulator sends carries none. The cluster's name and the body are copied,
    // as the callout keeps them.
    let parts = (|| {
        Ok::<_, Status>((
            read(&mut caller, upstream_ptr, upstream_len)?,
            memory::with_bytes(&mut caller, headers_ptr, headers_len, |bytes, _| {
                Ok(HeaderMap::from_pairs(decode_pairs(bytes)))
            })?,
            read(&mut caller, body_ptr, body_len)?,
            memory::with_bytes(&mut caller, trailers_ptr, trailers_len, |_, _| Ok(()))?,
        ))
    })();
    let (upstream, headers, body, ()) = match parts {
        Ok(p) => p,
        Err(s) => return status(s),
    };
    // Envoy checks the token's memory before starting anything.
    if let Err(s) = memory::write_u32(&mut caller, token_ptr, 0) {
        return status(s);
    }
    if timeout_ms < 0 {
        return status(Status::BadArgument);
    }
    let cluster = String::from_utf8_lossy(&upstream).into_owned();
    let state = caller.data_mut();
    if !state.callouts.clusters.contains(&cluster) {
        return status(Status::BadArgument);
    }
    if [":path", ":method", ":authority"]
        .iter()
        .any(|h| headers.get(h).is_none())
    {
        return status(Status::BadArgument);
    }
    let token = state.callouts.next_token;
    state.callouts.next_token = state.callouts.next_token.wrapping_add(4).max(4);
    state.callouts.outgoing.push(OutgoingCallout {
        token,
        cluster,
        headers: headers.into_pairs(),
        body,
        timeout_ms: timeout_ms as u32,
    });
    match memory::write_u32(&mut caller, token_ptr, token) {
        Ok(()) => status(Status::Ok),
        Err(s) => status(s),
    }
}

/// Adds `proxy_http_call`.
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_http_call", http_call)?;
    Ok(())
}
