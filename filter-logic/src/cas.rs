//! Read-modify-write of one shared-data key with compare-and-swap: every worker writes
//! the same keys (deny cache, lease allowances), and a write that lost the race to another
//! worker is decided again on what that worker wrote.

use crate::shared_data::{CREATE_ONLY, SharedData, WriteError};

/// Reads `key`, lets `f` decide from its current value (`None`: empty or unreadable) what to
/// write (`None`: nothing) and what to return, and writes with compare-and-swap, deciding
/// again when another worker wrote in between. `None` when every attempt lost the race or
/// the host refused the write.
pub fn update<S: SharedData + ?Sized, T, R>(
    data: &S,
    key: &str,
    attempts: usize,
    decode: fn(&[u8]) -> Option<T>,
    encode: fn(&T) -> Vec<u8>,
    mut f: impl FnMut(Option<T>) -> (Option<T>, R),
) -> Option<R> {
    for _ in 0..attempts {
        let (current, cas) = match data.read(key) {
            Some((bytes, cas)) => (decode(&bytes), cas),
            None => (None, CREATE_ONLY),
        };
        let (next, result) = f(current);
        let Some(next) = next else {
            return Some(result);
        };
        match data.write(key, &encode(&next), cas) {
            Ok(()) => return Some(result),
            Err(WriteError::CasMismatch) => continue,
            Err(WriteError::Refused) => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared_data::MemorySharedData;

    fn number(bytes: &[u8]) -> Option<u64> {
        std::str::from_utf8(bytes).ok()?.parse().ok()
    }

    fn text(n: &u64) -> Vec<u8> {
        n.to_string().into_bytes()
    }

    fn add(data: &MemorySharedData, by: u64, attempts: usize) -> Option<u64> {
        update(data, "k", attempts, number, text, |n| {
            let n = n.unwrap_or(0) + by;
            (Some(n), n)
        })
    }

    #[test]
    fn a_write_that_lost_the_race_is_decided_again_on_the_winner() {
        let data = MemorySharedData::default();
        assert_eq!(add(&data, 1, 4), Some(1));
        let raced = std::rc::Rc::new(std::cell::Cell::new(false));
        let once = raced.clone();
        data.interfere(move |data, key| {
            if !once.replace(true) {
                data.put(key, b"10");
            }
        });
        assert_eq!(add(&data, 1, 4), Some(11), "the other worker's 10, plus 1");
        assert!(raced.get());
    }

    #[test]
    fn two_workers_creating_a_key_at_once_lose_neither_update() {
        let data = MemorySharedData::default();
        let raced = std::rc::Rc::new(std::cell::Cell::new(false));
        let once = raced.clone();
        // The other worker creates the key after this one found it absent.
        data.interfere(move |data, key| {
            if !once.replace(true) {
                data.put(key, b"5");
            }
        });
        assert_eq!(add(&data, 1, 4), Some(6));
    }

    #[test]
    fn a_key_contended_on_every_attempt_gives_up() {
        let data = MemorySharedData::default();
        data.put("k", b"0");
        data.interfere(|data, key| data.put(key, b"7"));
        assert_eq!(add(&data, 1, 4), None);
        assert_eq!(data.writes.get(), 0);
    }
}
