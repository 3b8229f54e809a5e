//! The local deny cache in proxy-wasm shared data, shared by every worker's VM.
//!
//! Slots, encoding and the keep-the-longer-denial rule are [`sluice_core::deny_cache`]; this
//! module reads and writes them, with compare-and-swap so that two workers remembering
//! denials at once cannot lose the longer one.

use std::rc::Rc;

use sluice_core::deny_cache::{Entry, EntryId, SlotKeys};

use sluice_filter_logic::cas;
use sluice_filter_logic::shared_data::SharedData;

/// How often a write is retried after another worker changed the slot under it.
const CAS_ATTEMPTS: usize = 4;

/// The cache of one configuration.
pub struct DenyCache {
    data: Rc<dyn SharedData>,
    /// `None` when the cache is off.
    keys: Option<SlotKeys>,
}

impl DenyCache {
    /// A cache of `slots` slots (0: off) for the configuration with `fingerprint`.
    pub fn new(data: Rc<dyn SharedData>, fingerprint: String, slots: u32) -> DenyCache {
        DenyCache {
            data,
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
        let (bytes, _) = self.data.read(&keys.key_of(id))?;
        Entry::decode_denying(&bytes, id, now_ms)
    }

    /// Remembers a denial, unless its slot holds one that lasts longer.
    pub fn remember(&self, entry: &Entry, now_ms: u64) {
        let Some(keys) = &self.keys else {
            return;
        };
        let key = keys.key(&entry.id);
        cas::update(
            self.data.as_ref(),
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

#[cfg(test)]
mod tests {
    use sluice_core::deny_cache::entry_id;
    use sluice_core::key::{LimitKey, RuleName};

    use super::*;
    use sluice_filter_logic::shared_data::MemorySharedData;

    fn key(s: &str) -> (RuleName, LimitKey) {
        (
            RuleName::new("per-ip").unwrap(),
            LimitKey::parse(s).unwrap(),
        )
    }

    fn entry(id: &str, until_ms: u64) -> Entry {
        Entry {
            id: id.to_owned(),
            until_ms,
            reset_at_ms: until_ms,
            limit: 10,
        }
    }

    #[test]
    fn a_denial_one_worker_learns_is_seen_by_another_until_it_ends() {
        let data = Rc::new(MemorySharedData::default());
        let learner = DenyCache::new(data.clone(), "fp".to_owned(), 1024);
        let other = DenyCache::new(data, "fp".to_owned(), 1024);
        let (rule, k) = key("1.2.3.4");
        learner.remember(&entry(&entry_id(&rule, &k), 2_000), 1_000);
        let found = other.lookup(EntryId::new(&rule, &k), 1_500).expect("live");
        assert_eq!(found.until_ms, 2_000);
        assert_eq!(other.lookup(EntryId::new(&rule, &k), 2_000), None, "ended");
        let (_, k2) = key("5.6.7.8");
        assert_eq!(other.lookup(EntryId::new(&rule, &k2), 1_500), None);
    }

    #[test]
    fn of_two_workers_remembering_at_once_the_longer_denial_stays() {
        let data = Rc::new(MemorySharedData::default());
        // One slot: every key shares it.
        let cache = DenyCache::new(data.clone(), "fp".to_owned(), 1);
        let (rule, long) = key("long");
        let (_, short) = key("short");
        let longer = entry(&entry_id(&rule, &long), 9_000);
        let encoded = longer.encode();
        let raced = std::cell::Cell::new(false);
        // Another worker writes the longer denial between this one's read and write.
        data.interfere(move |data, key| {
            if !raced.replace(true) {
                data.put(key, &encoded);
            }
        });
        cache.remember(&entry(&entry_id(&rule, &short), 3_000), 1_000);
        assert_eq!(cache.lookup(EntryId::new(&rule, &short), 1_500), None);
        let kept = cache
            .lookup(EntryId::new(&rule, &long), 1_500)
            .expect("kept");
        assert_eq!(kept.until_ms, 9_000);
    }

    #[test]
    fn a_cache_that_is_off_remembers_nothing() {
        let data = Rc::new(MemorySharedData::default());
        let cache = DenyCache::new(data.clone(), "fp".to_owned(), 0);
        let (rule, k) = key("1.2.3.4");
        cache.remember(&entry(&entry_id(&rule, &k), 2_000), 1_000);
        assert_eq!(data.writes.get(), 0);
        assert_eq!(cache.lookup(EntryId::new(&rule, &k), 1_500), None);
    }
}
