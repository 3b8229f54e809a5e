//! The process-wide key-value store every worker reads and writes (proxy-wasm's shared data,
//! or the module's process memory), behind a small trait with the semantics of Envoy's shared
//! data; and an in-memory one for the unit tests of the logic over it (the deny cache, leases),
//! races included.
//!
//! Envoy's semantics: a read of an absent key finds nothing; every write gives the key a new CAS
//! from one counter starting at 1; a write with CAS 0 is unconditional; a write with another CAS
//! is refused only when the key exists with a different CAS (an absent key accepts any).

use std::rc::Rc;
use std::sync::Arc;

/// The CAS of a write to a key that was absent. Envoy accepts any CAS for an absent key but
/// refuses one that does not match a key that exists, so a write with this CAS creates the key
/// only if no other worker did in between: with CAS 0, two workers that both found it absent
/// would both write, and the first one's update would be lost. (CAS values count up from 1
/// across the process; a key holds this one only from the write at which the counter wraps.)
pub const CREATE_ONLY: u32 = u32::MAX;

/// Why a write was not made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteError {
    /// Another write came between this one's read and it.
    CasMismatch,
    /// The host refused it for another reason.
    Refused,
}

/// Shared data as the filters use it.
pub trait SharedData {
    /// The value of `key` and its CAS; `None` when absent or unreadable.
    fn read(&self, key: &str) -> Option<(Vec<u8>, u32)>;

    /// Writes `value` to `key` if its CAS is still `cas` (see the module's semantics).
    fn write(&self, key: &str, value: &[u8], cas: u32) -> Result<(), WriteError>;

    /// Removes `key` if its CAS is still `cas`; whether it did. Envoy's shared data keeps
    /// every key for the life of the VM's host, so by default nothing is removed.
    fn remove(&self, _key: &str, _cas: u32) -> bool {
        false
    }
}

impl<T: SharedData + ?Sized> SharedData for Rc<T> {
    fn read(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        (**self).read(key)
    }

    fn write(&self, key: &str, value: &[u8], cas: u32) -> Result<(), WriteError> {
        (**self).write(key, value, cas)
    }

    fn remove(&self, key: &str, cas: u32) -> bool {
        (**self).remove(key, cas)
    }
}

impl<T: SharedData + ?Sized> SharedData for Arc<T> {
    fn read(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        (**self).read(key)
    }

    fn write(&self, key: &str, value: &[u8], cas: u32) -> Result<(), WriteError> {
        (**self).write(key, value, cas)
    }

    fn remove(&self, key: &str, cas: u32) -> bool {
        (**self).remove(key, cas)
    }
}

#[cfg(any(test, feature = "testing"))]
pub use memory::MemorySharedData;

#[cfg(any(test, feature = "testing"))]
mod memory {
    use std::cell::{Cell, RefCell};
    use std::collections::HashMap;

    use super::{SharedData, WriteError};

    /// What runs before each write.
    type Interference = Box<dyn FnMut(&MemorySharedData, &str)>;

    /// Shared data in memory, with Envoy's CAS semantics, one store for any number of
    /// simulated workers; `interfere` runs before each write, to play another worker's write
    /// landing between a read and the write that follows it.
    #[derive(Default)]
    pub struct MemorySharedData {
        entries: RefCell<HashMap<String, (Vec<u8>, u32)>>,
        last_cas: Cell<u32>,
        interfere: RefCell<Option<Interference>>,
        /// Writes made, for tests that count host calls.
        pub writes: Cell<usize>,
    }

    impl MemorySharedData {
        /// Runs `f` before every write from now on.
        pub fn interfere(&self, f: impl FnMut(&MemorySharedData, &str) + 'static) {
            *self.interfere.borrow_mut() = Some(Box::new(f));
        }

        /// Writes `value` unconditionally, as another worker would.
        pub fn put(&self, key: &str, value: &[u8]) {
            let cas = self.last_cas.get() + 1;
            self.last_cas.set(cas);
            self.entries
                .borrow_mut()
                .insert(key.to_owned(), (value.to_vec(), cas));
        }
    }

    impl SharedData for MemorySharedData {
        fn read(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.entries.borrow().get(key).cloned()
        }

        fn write(&self, key: &str, value: &[u8], cas: u32) -> Result<(), WriteError> {
            let hook = self.interfere.borrow_mut().take();
            if let Some(mut hook) = hook {
                hook(self, key);
                *self.interfere.borrow_mut() = Some(hook);
            }
            let current = self.entries.borrow().get(key).map(|(_, cas)| *cas);
            if let Some(current) = current
                && cas != 0
                && cas != current
            {
                return Err(WriteError::CasMismatch);
            }
            self.writes.set(self.writes.get() + 1);
            self.put(key, value);
            Ok(())
        }

        fn remove(&self, key: &str, cas: u32) -> bool {
            let mut entries = self.entries.borrow_mut();
            if entries.get(key).is_some_and(|(_, current)| *current == cas) {
                entries.remove(key);
                return true;
            }
            false
        }
    }
}
