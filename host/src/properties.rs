//! Properties: `proxy_get_property`, `proxy_set_property`.
//!
//! Encoded as Envoy encodes them: strings raw, integers 8-byte little-endian, timestamps and
//! durations int64 nanoseconds; addresses `ip:port` (`[v6]:port`). `node.id` (the Envoy's
//! bootstrap node id) and the plugin's names answer in the root context too. `proxy_set_property` stores
//! filter state under `wasm.` + the path's bytes exactly (a trailing NUL included), and a
//! top-level name that is not a known attribute is looked up there.

use std::net::IpAddr;

use wasmtime::{Caller, Linker};

use super::abi::{Status, encode_pairs, split_path};
use super::memory::{self, HostResult, finish, or_status, status};
use super::state::{HostState, MapAccess, StreamHost};

/// `ip:port`, or `[ip]:port` for IPv6.
pub fn address(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => {
            // Without `format!`: filters read this on every request.
            let mut text = sluice_core::key::dotted_quad(v4);
            text.push(':');
            text.push_str(&port.to_string());
            text
        }
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}

fn int(v: i64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

fn request_attribute(stream: &StreamHost, name: &[u8], rest: &[&[u8]]) -> Option<Vec<u8>> {
    let props = &stream.properties;
    let headers = &stream.request_headers;
    let path = headers.get(":path").unwrap_or_default();
    let (url_path, query) = match path.iter().position(|&b| b == b'?') {
        Some(q) => (&path[..q], &path[q + 1..]),
        None => (path, &path[path.len()..]),
    };
    Some(match name {
        b"path" => path.to_vec(),
        b"url_path" => url_path.to_vec(),
        b"query" => query.to_vec(),
        b"host" => headers.get(":authority")?.to_vec(),
        b"scheme" => headers.get(":scheme")?.to_vec(),
        b"method" => headers.get(":method")?.to_vec(),
        b"referer" => headers.get("referer")?.to_vec(),
        b"useragent" => headers.get("user-agent")?.to_vec(),
        b"id" => props.request_id.clone().into_bytes(),
        b"protocol" => props.protocol.clone().into_bytes(),
        b"time" => int(props.request_time_ns),
        b"headers" => match rest.first() {
            Some(header) => headers.get(&String::from_utf8_lossy(header))?.to_vec(),
            None => encode_pairs(headers.pairs()),
        },
        _ => return None,
    })
}

fn lookup(state: &mut HostState, path: &[u8]) -> Result<Vec<u8>, Status> {
    let parts = split_path(path);
    let (first, rest) = parts.split_first().ok_or(Status::NotFound)?;
    match *first {
        b"plugin_name" => return Ok(state.info.plugin_name.clone().into_bytes()),
        b"plugin_root_id" => return Ok(state.info.root_id.clone().into_bytes()),
        b"plugin_vm_id" => return Ok(state.info.vm_id.clone().into_bytes()),
        b"node" if rest.first() == Some(&&b"id"[..]) => {
            return Ok(state.info.node_id.clone().into_bytes());
        }
        _ => {}
    }
    let stream = state.target_stream().ok_or(Status::NotFound)?;
    let props = &stream.properties;
    let second = rest.first().copied();
    let value = match (*first, second) {
        (b"source", Some(b"address")) => {
            Some(address(props.source_ip, props.source_port).into_bytes())
        }
        (b"source", Some(b"port")) => Some(int(i64::from(props.source_port))),
        (b"destination", Some(b"address")) => {
            Some(address(props.destination_ip, props.destination_port).into_bytes())
        }
        (b"destination", Some(b"port")) => Some(int(i64::from(props.destination_port))),
        (b"request", Some(name))
            if stream.request_access != MapAccess::Unavailable
                || name == b"time"
                || name == b"id" =>
        {
            request_attribute(stream, name, &rest[1..])
        }
        (b"response", Some(b"code")) => props.response_code.map(|c| int(i64::from(c))),
        (b"route_name", None) => Some(props.route_name.clone().into_bytes()),
        (b"cluster_name", None) => Some(props.cluster_name.clone().into_bytes()),
        (b"connection_id", None) => Some(props.connection_id.to_le_bytes().to_vec()),
        (name, None) => {
            let mut key = b"wasm.".to_vec();
            key.extend_from_slice(name);
            stream.filter_state.get(&key).cloned()
        }
        _ => None,
    };
    value.ok_or(Status::NotFound)
}

fn get_property(
    mut caller: Caller<'_, HostState>,
    path_ptr: i32,
    path_len: i32,
    ptr_ptr: i32,
    size_ptr: i32,
) -> HostResult {
    let value = or_status!(memory::with_bytes(
        &mut caller,
        path_ptr,
        path_len,
        |path, state| lookup(state, path)
    ));
    finish(memory::give(&mut caller, &value, ptr_ptr, size_ptr))
}

fn set_property(
    mut caller: Caller<'_, HostState>,
    path_ptr: i32,
    path_len: i32,
    value_ptr: i32,
    value_len: i32,
) -> HostResult {
    let (path, value) = or_status!(memory::read_two(
        &mut caller,
        (path_ptr, path_len),
        (value_ptr, value_len)
    ));
    // Filter state needs a stream's info: the root context has none.
    let Some(stream) = caller.data_mut().target_stream() else {
        return status(Status::NotFound);
    };
    let mut key = b"wasm.".to_vec();
    key.extend_from_slice(&path);
    stream.filter_state.insert(key, value);
    status(Status::Ok)
}

/// Adds the property host calls.
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_get_property", get_property)?;
    linker.func_wrap("env", "proxy_set_property", set_property)?;
    Ok(())
}
