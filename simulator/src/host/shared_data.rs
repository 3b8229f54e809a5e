//! Shared data and shared queues: `proxy_{get,set}_shared_data`,
//! `proxy_{register,resolve,enqueue,dequeue}_shared_queue`.
//!
//! As in Envoy's host: data is process-wide per `vm_id`, so every worker's VM of one Envoy sees
//! it; CAS values come from one counter starting at 1; a CAS of 0 writes unconditionally; a
//! mismatch is reported only when the key exists with another CAS; an absent key is
//! `NotFound`.

use std::collections::VecDeque;

// Looked up by every host call: a fast hash, not a DoS-resistant one (no key here is chosen
// by a client).
use rustc_hash::FxHashMap as HashMap;
use std::sync::Mutex;

use wasmtime::{Caller, Linker};

use super::abi::Status;
use super::memory::{self, HostResult, finish, or_status, status};
use super::state::HostState;

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

    fn register_queue(&self, vm_id: &str, name: &[u8]) -> u32 {
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

    fn resolve_queue(&self, vm_id: &[u8], name: &[u8]) -> Option<u32> {
        let inner = self.lock();
        inner
            .queues
            .iter()
            .position(|q| q.vm_id.as_bytes() == vm_id && q.name == name)
            .map(|i| i as u32 + 1)
    }

    fn with_queue<T>(&self, token: u32, f: impl FnOnce(&mut VecDeque<Vec<u8>>) -> T) -> Option<T> {
        let mut inner = self.lock();
        let queue = inner.queues.get_mut((token as usize).checked_sub(1)?)?;
        Some(f(&mut queue.items))
    }
}

fn get(
    mut caller: Caller<'_, HostState>,
    key_ptr: i32,
    key_len: i32,
    ptr_ptr: i32,
    size_ptr: i32,
    cas_ptr: i32,
) -> HostResult {
    let found = or_status!(memory::with_bytes(
        &mut caller,
        key_ptr,
        key_len,
        |key, state| Ok(state.shared.get(&state.info.vm_id, key))
    ));
    let Some((value, cas)) = found else {
        return status(Status::NotFound);
    };
    finish(
        memory::give(&mut caller, &value, ptr_ptr, size_ptr)
            .map(|r| r.and_then(|()| memory::write_u32(&mut caller, cas_ptr, cas))),
    )
}

fn set(
    mut caller: Caller<'_, HostState>,
    key_ptr: i32,
    key_len: i32,
    value_ptr: i32,
    value_len: i32,
    cas: i32,
) -> HostResult {
    let (key, value) = or_status!(memory::read_two(
        &mut caller,
        (key_ptr, key_len),
        (value_ptr, value_len)
    ));
    let state = caller.data();
    status(
        state
            .shared
            .set(&state.info.vm_id, &key, &value, cas as u32),
    )
}

fn register_queue(
    mut caller: Caller<'_, HostState>,
    name_ptr: i32,
    name_len: i32,
    token_ptr: i32,
) -> HostResult {
    let name = or_status!(memory::read(&mut caller, name_ptr, name_len));
    let state = caller.data();
    let token = state.shared.register_queue(&state.info.vm_id, &name);
    finish(Ok(memory::write_u32(&mut caller, token_ptr, token)))
}

fn resolve_queue(
    mut caller: Caller<'_, HostState>,
    vm_ptr: i32,
    vm_len: i32,
    name_ptr: i32,
    name_len: i32,
    token_ptr: i32,
) -> HostResult {
    let (vm_id, name) = or_status!(memory::read_two(
        &mut caller,
        (vm_ptr, vm_len),
        (name_ptr, name_len)
    ));
    match caller.data().shared.resolve_queue(&vm_id, &name) {
        Some(token) => finish(Ok(memory::write_u32(&mut caller, token_ptr, token))),
        None => status(Status::NotFound),
    }
}

fn enqueue(mut caller: Caller<'_, HostState>, token: i32, ptr: i32, len: i32) -> HostResult {
    let value = or_status!(memory::read(&mut caller, ptr, len));
    match caller
        .data()
        .shared
        .with_queue(token as u32, |q| q.push_back(value))
    {
        Some(()) => status(Status::Ok),
        None => status(Status::NotFound),
    }
}

fn dequeue(
    mut caller: Caller<'_, HostState>,
    token: i32,
    ptr_ptr: i32,
    size_ptr: i32,
) -> HostResult {
    match caller
        .data()
        .shared
        .with_queue(token as u32, VecDeque::pop_front)
    {
        None => status(Status::NotFound),
        Some(None) => status(Status::Empty),
        Some(Some(value)) => finish(memory::give(&mut caller, &value, ptr_ptr, size_ptr)),
    }
}

/// Adds the shared data and queue host calls.
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_get_shared_data", get)?;
    linker.func_wrap("env", "proxy_set_shared_data", set)?;
    linker.func_wrap("env", "proxy_register_shared_queue", register_queue)?;
    linker.func_wrap("env", "proxy_resolve_shared_queue", resolve_queue)?;
    linker.func_wrap("env", "proxy_enqueue_shared_queue", enqueue)?;
    linker.func_wrap("env", "proxy_dequeue_shared_queue", dequeue)?;
    Ok(())
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
