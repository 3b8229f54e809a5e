//! Read-modify-write of one proxy-wasm shared-data key with compare-and-swap: every worker's
//! VM writes the same keys (deny cache, lease allowances), and a write that lost the race to
//! another worker is decided again on what that worker wrote.

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

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
        match hostcalls::set_shared_data(key, Some(&encode(&next)), cas) {
            Ok(()) => return Some(result),
            Err(Status::CasMismatch) => continue,
            Err(_) => return None,
        }
    }
    None
}
