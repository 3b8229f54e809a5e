//! Read-modify-write of one proxy-wasm shared-data key with compare-and-swap: every worker's
//! VM writes the same keys (deny cache, lease allowances), and a write that lost the race to
//! another worker is decided again on what that worker wrote.

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

/// The CAS of a write to a key that was absent. Envoy accepts any CAS for an absent key but
/// refuses one that does not match a key that exists, so a write with this CAS creates the key
/// only if no other worker did in between: with CAS 0, two workers that both found it absent
/// would both write, and the first one's update would be lost. (CAS values count up from 1
/// across the process; a key holds this one only from the write at which the counter wraps.)
const CREATE_ONLY: u32 = u32::MAX;

/// Reads `key`, lets `f` decide from its current value (`None`: empty or unreadable) what to
/// write (`None`: nothing) and what to return, and writes with compare-and-swap, deciding
/// again when another worker wrote in between. `None` when every attempt lost the race or
/// the host refused the write.
pub fn update<T, R>(
    key: &str,
    attempts: usize,
    decode: fn(&[u8]) -> Option<T>,
    encode: fn(&T) -> Vec<u8>,
    mut f: impl FnMut(Option<T>) -> (Option<T>, R),
) -> Option<R> {
    for _ in 0..attempts {
        let (current, cas) = match hostcalls::get_shared_data(key) {
            Ok((bytes, cas)) => (bytes.as_deref().and_then(decode), cas),
            Err(_) => (None, None),
        };
        let (next, result) = f(current);
        let Some(next) = next else {
            return Some(result);
        };
        match hostcalls::set_shared_data(key, Some(&encode(&next)), cas.or(Some(CREATE_ONLY))) {
            Ok(()) => return Some(result),
            Err(Status::CasMismatch) => continue,
            Err(_) => return None,
        }
    }
    None
}
