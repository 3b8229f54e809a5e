//! The local deny cache in proxy-wasm shared data, shared by every worker's VM.
//!
//! Slots, encoding and the keep-the-longer-denial rule are [`sluice_core::deny_cache`]; this
//! module reads and writes them, with compare-and-swap so that two workers remembering
//! denials at once cannot lose the longer one.

use proxy_wasm::hostcalls;
use sluice_core::deny_cache::{Entry, EntryId, SlotKeys};

use crate::cas;

/// How often a write is retried after another worker changed the slot under it.
const CAS_ATTEMPTS: usize = 4;

/// The cache of one configuration.
pub struct DenyCache {
    /// `None` when the cache is off.
    keys: Option<SlotKeys>,
}

impl DenyCache {
    /// A cache of `slots` slots (0: off) for the configuration with `fingerprint`.
    pub fn new(fingerprint: String, slots: u32) -> DenyCache {
        DenyCache {
            keys: (slots > 0).then(|| SlotKeys::new(&fingerprint, slots)),
        }
    }

    /// Whether the cache is on.
    pub fn enabled(&self) -> bool {
        self.keys.is_some()
    }

    /// The live denial of `id`, if the cache holds one at `now_ms`.
    pub fn lookup(&self, id: EntryId<'_>, now_ms: u64) -> Option<Entry> {
        let keys = self.keys.as_ref()?;
        let bytes = hostcalls::get_shared_data(&keys.key_of(id)).ok()?.0?;
        Entry::decode_denying(&bytes, id, now_ms)
    }

    /// Remembers a denial, unless its slot holds one that lasts longer.
    pub fn remember(&self, entry: &Entry, now_ms: u64) {
        let Some(keys) = &self.keys else {
            return;
        };
        let key = keys.key(&entry.id);
        cas::update(
            &key,
            CAS_ATTEMPTS,
            Entry::decode,
            Entry::encode,
            |current| {
                let write = entry.should_replace(current.as_ref(), now_ms);
                (write.then(|| entry.clone()), ())
            },
        );
    }
}
