//! Header maps: `proxy_{get,add,replace,remove}_header_map_value`,
//! `proxy_{get,set}_header_map_pairs`, `proxy_get_header_map_size`.
//!
//! As in Envoy: names are lower-cased on the way in; a get returns the first value; a map that
//! is not available is `BadArgument` (but its pairs read as empty); the size is in bytes.

use wasmtime::{Caller, Linker};

use super::abi::{MapType, Status, decode_pairs, encode_pairs};
use super::header_map::HeaderMap;
use super::memory::{self, Access, HostResult, finish, or_status, status};
use super::state::{HostState, MapAccess};

fn readable(state: &mut HostState, map: i32) -> Access<&HeaderMap> {
    let map = MapType::from_abi(map).ok_or(Status::BadArgument)?;
    match map {
        MapType::CalloutResponseHeaders => state
            .callouts
            .reply
            .as_ref()
            .and_then(|r| r.headers.as_ref())
            .ok_or(Status::BadArgument),
        // Envoy's answer has no trailer map at all unless trailers came.
        MapType::CalloutResponseTrailers => state
            .callouts
            .reply
            .as_ref()
            .map(|r| &r.trailers)
            .filter(|t| !t.is_empty())
            .ok_or(Status::BadArgument),
        MapType::RequestHeaders | MapType::ResponseHeaders => {
            let stream = state.target_stream().ok_or(Status::BadArgument)?;
            let (headers, access) = if map == MapType::RequestHeaders {
                (&stream.request_headers, stream.request_access)
            } else {
                (&stream.response_headers, stream.response_access)
            };
            if access == MapAccess::Unavailable {
                Err(Status::BadArgument)
            } else {
                Ok(headers)
            }
        }
        // The simulator's streams carry no trailers. Envoy answers a map that is not there
        // with BadArgument, except in the access-log phase, where it is NotFound.
        MapType::RequestTrailers | MapType::ResponseTrailers => match state.target_stream() {
            Some(stream) if stream.request_access == MapAccess::ReadOnly => Err(Status::NotFound),
            _ => Err(Status::BadArgument),
        },
        _ => Err(Status::BadArgument),
    }
}

fn writable(state: &mut HostState, map: i32) -> Access<&mut HeaderMap> {
    let map = MapType::from_abi(map).ok_or(Status::BadArgument)?;
    let stream = state.target_stream().ok_or(Status::BadArgument)?;
    let (headers, access) = match map {
        MapType::RequestHeaders => (&mut stream.request_headers, stream.request_access),
        MapType::ResponseHeaders => (&mut stream.response_headers, stream.response_access),
        _ => return Err(Status::BadArgument),
    };
    if access == MapAccess::Writable {
        Ok(headers)
    } else {
        Err(Status::BadArgument)
    }
}

fn get_value(
    mut caller: Caller<'_, HostState>,
    map: i32,
    key_ptr: i32,
    key_len: i32,
    ptr_ptr: i32,
    size_ptr: i32,
) -> HostResult {
    let index = or_status!(memory::with_bytes(
        &mut caller,
        key_ptr,
        key_len,
        |key, state| readable(state, map)?.position(key).ok_or(Status::NotFound)
    ));
    finish(memory::give_held(
        &mut caller,
        |state| {
            let pairs = readable(state, map)?.pairs();
            let (_, value) = pairs.get(index).ok_or(Status::InternalFailure)?;
            Ok(value.as_slice())
        },
        ptr_ptr,
        size_ptr,
    ))
}

fn modify(
    mut caller: Caller<'_, HostState>,
    map: i32,
    key: (i32, i32),
    value: Option<(i32, i32)>,
    edit: fn(&mut HeaderMap, &[u8], Vec<u8>),
) -> HostResult {
    // The value is copied out once, into the map (both regions cannot be borrowed with the
    // state); the name is read in place.
    let value = match value {
        Some((p, l)) => or_status!(memory::read(&mut caller, p, l)),
        None => Vec::new(),
    };
    let edited = memory::with_bytes(&mut caller, key.0, key.1, |key, state| {
        edit(writable(state, map)?, key, value);
        Ok(())
    });
    status(edited.err().unwrap_or(Status::Ok))
}

fn get_pairs(
    mut caller: Caller<'_, HostState>,
    map: i32,
    ptr_ptr: i32,
    size_ptr: i32,
) -> HostResult {
    if MapType::from_abi(map).is_none() {
        return status(Status::BadArgument);
    }
    // A map that is not there reads as no pairs (Envoy's headerMapToPairs of a null map).
    let pairs = readable(caller.data_mut(), map)
        .map(|h| h.pairs().to_vec())
        .unwrap_or_default();
    let bytes = if pairs.is_empty() {
        Vec::new()
    } else {
        encode_pairs(&pairs)
    };
    finish(memory::give(&mut caller, &bytes, ptr_ptr, size_ptr))
}

fn set_pairs(mut caller: Caller<'_, HostState>, map: i32, ptr: i32, size: i32) -> HostResult {
    let bytes = or_status!(memory::read(&mut caller, ptr, size));
    match writable(caller.data_mut(), map) {
        Ok(headers) => {
            *headers = HeaderMap::from_pairs(decode_pairs(&bytes));
            status(Status::Ok)
        }
        Err(s) => status(s),
    }
}

fn get_size(mut caller: Caller<'_, HostState>, map: i32, size_ptr: i32) -> HostResult {
    let size = match writable(caller.data_mut(), map) {
        Ok(headers) => headers.byte_size(),
        Err(s) => return status(s),
    };
    finish(Ok(memory::write_u32(&mut caller, size_ptr, size as u32)))
}

/// Adds the header-map host calls.
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_get_header_map_value", get_value)?;
    linker.func_wrap(
        "env",
        "proxy_add_header_map_value",
        |c: Caller<'_, HostState>, map: i32, kp: i32, kl: i32, vp: i32, vl: i32| {
            modify(c, map, (kp, kl), Some((vp, vl)), |h, k, v| h.add(k, v))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_replace_header_map_value",
        |c: Caller<'_, HostState>, map: i32, kp: i32, kl: i32, vp: i32, vl: i32| {
            modify(c, map, (kp, kl), Some((vp, vl)), |h, k, v| h.replace(k, v))
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        |c: Caller<'_, HostState>, map: i32, kp: i32, kl: i32| {
            modify(c, map, (kp, kl), None, |h, k, _| h.remove(k))
        },
    )?;
    linker.func_wrap("env", "proxy_get_header_map_pairs", get_pairs)?;
    linker.func_wrap("env", "proxy_set_header_map_pairs", set_pairs)?;
    linker.func_wrap("env", "proxy_get_header_map_size", get_size)?;
    Ok(())
}
