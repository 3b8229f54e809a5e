//! The process-wide shared data and queues, per `vm_id`.

use std::collections::VecDeque;
use std::sync::Mutex;

// Looked up by every host call: a fast hash, not a DoS-resistant one (no key here is chosen
// by a client).
use rustc_hash::FxHashMap as HashMap;

use super::abi::Status;

/// A vm_id's data: key to (value, CAS).
type VmData = HashMap<Vec<u8>, (Vec<u8>, u32)>;

#[derive(Default)]
struct Inner {
    next_cas: u32,
    data: HashMap<String, VmData>,
    queues: Vec<Queue>,
}

struct Queue {
    vm_id: String,
    name: Vec<u8>,
    items: VecDeque<Vec<u8>>,
}

/// Shared data and queues of one Envoy process.
#[derive(Default)]
pub struct SharedData {
    inner: Mutex<Inner>,
}

impl SharedData {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The value and CAS of `key` for `vm_id`.
    pub fn get(&self, vm_id: &str, key: &[u8]) -> Option<(Vec<u8>, u32)> {
        self.lock().data.get(vm_id)?.get(key).cloned()
    }

    /// Sets `key` if `cas` is 0 or matches.
    pub fn set(&self, vm_id: &str, key: &[u8], value: &[u8], cas: u32) -> Status {
        let mut inner = self.lock();
        inner.next_cas = inner.next_cas.wrapping_add(1).max(1);
        let next = inner.next_cas;
        let map = inner.data.entry(vm_id.to_owned()).or_default();
        match map.get_mut(key) {
            Some((_, current)) if cas != 0 && cas != *current => Status::CasMismatch,
            Some(entry) => {
                *entry = (value.to_vec(), next);
                Status::Ok
            }
            None => {
                map.insert(key.to_vec(), (value.to_vec(), next));
                Status::Ok
            }
        }
    }

    /// Every key of `vm_id` (for reports and tests).
    pub fn len(&self, vm_id: &str) -> usize {
        self.lock().data.get(vm_id).map_or(0, HashMap::len)
    }

    /// Whether `vm_id` has no keys.
    pub fn is_empty(&self, vm_id: &str) -> bool {
        self.len(vm_id) == 0
    }

    pub(super) fn register_queue(&self, vm_id: &str, name: &[u8]) -> u32 {
        let mut inner = self.lock();
        if let Some(i) = inner
            .queues
            .iter()
            .position(|q| q.vm_id == vm_id && q.name == name)
        {
            return i as u32 + 1;
        }
        inner.queues.push(Queue {
            vm_id: vm_id.to_owned(),
            name: name.to_vec(),
            items: VecDeque::new(),
        });
        inner.queues.len() as u32
    }

    pub(super) fn resolve_queue(&self, vm_id: &[u8], name: &[u8]) -> Option<u32> {
        let inner = self.lock();
        inner
            .queues
            .iter()
            .position(|q| q.vm_id.as_bytes() == vm_id && q.name == name)
            .map(|i| i as u32 + 1)
    }

    pub(super) fn with_queue<T>(
        &self,
        token: u32,
        f: impl FnOnce(&mut VecDeque<Vec<u8>>) -> T,
    ) -> Option<T> {
        let mut inner = self.lock();
        let queue = inner.queues.get_mut((token as usize).checked_sub(1)?)?;
        Some(f(&mut queue.items))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_and_swap_follows_envoy() {
        let shared = SharedData::default();
        assert_eq!(shared.get("vm", b"k"), None);
        assert_eq!(
            shared.set("vm", b"k", b"1", 12345),
            Status::Ok,
            "an absent key accepts any CAS"
        );
        let (_, cas) = shared.get("vm", b"k").unwrap();
        assert_eq!(cas, 1);
        assert_eq!(shared.set("vm", b"k", b"2", cas + 7), Status::CasMismatch);
        assert_eq!(shared.set("vm", b"k", b"2", cas), Status::Ok);
        assert_eq!(
            shared.set("vm", b"k", b"3", cas),
            Status::CasMismatch,
            "the CAS moved on"
        );
        assert_eq!(
            shared.set("vm", b"k", b"4", 0),
            Status::Ok,
            "CAS 0 writes unconditionally"
        );
        assert_eq!(shared.get("other-vm", b"k"), None, "data is per vm_id");
    }
}
