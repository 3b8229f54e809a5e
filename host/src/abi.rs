//! The proxy-wasm ABI 0.2.1's numbers and encodings, as Envoy's host uses them.

/// Host-call results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// No such key, property or buffer.
    NotFound = 1,
    /// A bad argument, or a map or buffer not available now.
    BadArgument = 2,
    /// A value that could not be serialized.
    SerializationFailure = 3,
    /// A value that could not be parsed.
    ParseFailure = 4,
    /// A pointer outside the module's memory.
    InvalidMemoryAccess = 6,
    /// An empty queue.
    Empty = 7,
    /// A compare-and-swap that lost.
    CasMismatch = 8,
    /// Anything else.
    InternalFailure = 10,
    /// A callout reset or answered past the buffer limit (`proxy_get_status` only).
    BrokenConnection = 11,
    /// Not supported by this host.
    Unimplemented = 12,
}

impl From<Status> for i32 {
    fn from(s: Status) -> i32 {
        s as i32
    }
}

/// Header maps by ABI number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapType {
    /// 0
    RequestHeaders,
    /// 1
    RequestTrailers,
    /// 2
    ResponseHeaders,
    /// 3
    ResponseTrailers,
    /// 4
    GrpcInitialMetadata,
    /// 5
    GrpcTrailingMetadata,
    /// 6
    CalloutResponseHeaders,
    /// 7
    CalloutResponseTrailers,
}

impl MapType {
    /// The map numbered `n`, if any.
    pub fn from_abi(n: i32) -> Option<MapType> {
        Some(match n {
            0 => MapType::RequestHeaders,
            1 => MapType::RequestTrailers,
            2 => MapType::ResponseHeaders,
            3 => MapType::ResponseTrailers,
            4 => MapType::GrpcInitialMetadata,
            5 => MapType::GrpcTrailingMetadata,
            6 => MapType::CalloutResponseHeaders,
            7 => MapType::CalloutResponseTrailers,
            _ => return None,
        })
    }
}

/// Buffers by ABI number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferType {
    /// 0
    RequestBody,
    /// 1
    ResponseBody,
    /// 2
    DownstreamData,
    /// 3
    UpstreamData,
    /// 4
    CalloutResponseBody,
    /// 5
    GrpcMessage,
    /// 6
    VmConfiguration,
    /// 7
    PluginConfiguration,
    /// 8
    CallData,
}

impl BufferType {
    /// The buffer numbered `n`, if any.
    pub fn from_abi(n: i32) -> Option<BufferType> {
        Some(match n {
            0 => BufferType::RequestBody,
            1 => BufferType::ResponseBody,
            2 => BufferType::DownstreamData,
            3 => BufferType::UpstreamData,
            4 => BufferType::CalloutResponseBody,
            5 => BufferType::GrpcMessage,
            6 => BufferType::VmConfiguration,
            7 => BufferType::PluginConfiguration,
            8 => BufferType::CallData,
            _ => return None,
        })
    }
}

/// What a stream callback returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Go on to the next filter.
    Continue,
    /// Stop here until `continue_stream` or a local reply.
    Pause,
}

impl Action {
    /// The action numbered `n`; Envoy treats anything but 0 as a stop.
    pub fn from_abi(n: i32) -> Action {
        if n == 0 {
            Action::Continue
        } else {
            Action::Pause
        }
    }
}

/// A serialized header map: u32 count, then (u32 key length, u32 value length) per pair, then
/// each key and value followed by a NUL; little-endian.
pub fn encode_pairs<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> Vec<u8> {
    let size = 4 + pairs
        .iter()
        .map(|(k, v)| 8 + k.as_ref().len() + v.as_ref().len() + 2)
        .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.as_ref().len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.as_ref().len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_ref());
        out.push(0);
        out.extend_from_slice(v.as_ref());
        out.push(0);
    }
    out
}

/// Reads a serialized map, in place. As Envoy's host does, anything malformed reads as no
/// pairs.
pub fn decode_pairs(bytes: &[u8]) -> Vec<(&[u8], &[u8])> {
    fn u32_at(bytes: &[u8], at: usize) -> Option<usize> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize)
    }
    let parse = || -> Option<Vec<(&[u8], &[u8])>> {
        let count = u32_at(bytes, 0)?;
        let mut sizes = Vec::with_capacity(count.min(1024));
        for i in 0..count {
            sizes.push((u32_at(bytes, 4 + i * 8)?, u32_at(bytes, 8 + i * 8)?));
        }
        let mut at = 4 + count.checked_mul(8)?;
        let mut pairs = Vec::with_capacity(count.min(1024));
        for (klen, vlen) in sizes {
            let key = bytes.get(at..at + klen)?;
            at += klen + 1;
            let value = bytes.get(at..at + vlen)?;
            at += vlen + 1;
            pairs.push((key, value));
        }
        Some(pairs)
    };
    parse().unwrap_or_default()
}

/// A property path: segments separated by NUL. A trailing NUL (the Rust SDK writes one) ends
/// the path, as in Envoy's parser.
pub fn split_path(path: &[u8]) -> Vec<&[u8]> {
    let mut parts: Vec<&[u8]> = path.split(|&b| b == 0).collect();
    if parts.last().is_some_and(|p| p.is_empty()) {
        parts.pop();
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_and_junk_is_empty() {
        let pairs = vec![
            (b":path".to_vec(), b"/a".to_vec()),
            (b"x".to_vec(), vec![0xff, 0]),
        ];
        let encoded = encode_pairs(&pairs);
        let decoded: Vec<(Vec<u8>, Vec<u8>)> = decode_pairs(&encoded)
            .into_iter()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect();
        assert_eq!(decoded, pairs);
        assert!(decode_pairs(&[1, 0, 0, 0, 9, 9]).is_empty());
        assert!(decode_pairs(&[]).is_empty());
    }

    #[test]
    fn paths_split_on_nul() {
        assert_eq!(split_path(b"source\0address"), [&b"source"[..], b"address"]);
        assert_eq!(
            split_path(b"source\0address\0"),
            [&b"source"[..], b"address"]
        );
    }
}
