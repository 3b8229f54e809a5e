//! Header maps: `proxy_{get,add,replace,remove}_header_map_value`,
//! `proxy_{get,set}_header_map_pairs`, `proxy_get_header_map_size`.
//!
//! As in Envoy: names are lower-cased on the way in; a get returns the first value; a map that
//! is not available is `BadArgument` (but its pairs read as empty); the size is in bytes.

use wasmtime::{Caller, Linker};

use super::abi::{MapType, Status, decode_pairs, encode_pairs};
use super::memory::{self, Access, HostResult, finish, or_status, status};
use super::state::{HostState, MapAccess};

/// An ordered header map with lower-case names; a name may repeat.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderMap {
    pairs: Vec<(String, Vec<u8>)>,
}

fn lower(name: &[u8]) -> String {
    match std::str::from_utf8(name) {
        // The common case, names already in lower case: one copy.
        Ok(name) if !name.bytes().any(|b| b.is_ascii_uppercase()) => name.to_owned(),
        _ => String::from_utf8_lossy(name).to_ascii_lowercase(),
    }
}

impl HeaderMap {
    /// A map of these pairs, names lower-cased.
    pub fn from_pairs<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> HeaderMap {
        HeaderMap {
            pairs: pairs
                .into_iter()
                .map(|(k, v)| (lower(k.as_ref()), v.as_ref().to_vec()))
                .collect(),
        }
    }

    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.get_bytes(name.as_bytes())
    }

    /// The first value of `name`, given as bytes (a name that is not UTF-8 matches none).
    pub fn get_bytes(&self, name: &[u8]) -> Option<&[u8]> {
        self.position(name).map(|i| self.pairs[i].1.as_slice())
    }

    /// Where the first value of `name` is among the pairs.
    pub fn position(&self, name: &[u8]) -> Option<usize> {
        // Names are stored in lower case: comparing without case is comparing with `name`
        // lower-cased.
        self.pairs
            .iter()
            .position(|(k, _)| k.as_bytes().eq_ignore_ascii_case(name))
    }

    /// Appends a value.
    pub fn add(&mut self, name: &[u8], value: impl Into<Vec<u8>>) {
        self.pairs.push((lower(name), value.into()));
    }

    /// Replaces every value of `name` by one (appending it if absent).
    pub fn replace(&mut self, name: &[u8], value: impl Into<Vec<u8>>) {
        let name = lower(name);
        match self.pairs.iter().position(|(k, _)| *k == name) {
            Some(first) => {
                self.pairs[first].1 = value.into();
                let mut i = 0;
                self.pairs.retain(|(k, _)| {
                    i += 1;
                    i - 1 == first || *k != name
                });
            }
            None => self.pairs.push((name, value.into())),
        }
    }

    /// Removes every value of `name`.
    pub fn remove(&mut self, name: &[u8]) {
        let name = lower(name);
        self.pairs.retain(|(k, _)| *k != name);
    }

    /// The pairs, in order.
    pub fn pairs(&self) -> &[(String, Vec<u8>)] {
        &self.pairs
    }

    /// The pairs, in order, given up.
    pub fn into_pairs(self) -> Vec<(String, Vec<u8>)> {
        self.pairs
    }

    /// Bytes of names and values, as Envoy's `byteSize()`.
    pub fn byte_size(&self) -> usize {
        self.pairs.iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lower_cased_and_gets_return_the_first_value() {
        let mut h = HeaderMap::from_pairs([("X-A", "1"), ("x-a", "2")]);
        assert_eq!(h.get("X-a"), Some(&b"1"[..]));
        h.replace(b"X-A", b"3");
        assert_eq!(h.pairs(), [("x-a".to_owned(), b"3".to_vec())]);
        h.add(b"Y", b"");
        assert_eq!(h.byte_size(), 3 + 1 + 1);
        h.remove(b"x-A");
        assert_eq!(h.len(), 1);
    }
}
