//! The deny cache in process memory, shared by every worker: the slots and the
//! keep-the-longer-denial rule of [`sluice_core::deny_cache`], each slot behind its own lock
//! (held for a lookup or a write, never across a call into Envoy).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_core::deny_cache::{Entry, EntryId, slot_of, slot_of_written};

/// The cache of one configuration: `None` slots when it is off.
pub struct DenyCache {
    slots: Box<[Mutex<Option<Entry>>]>,
    /// The latest end of any denial ever remembered: past it no slot holds a live one, and a
    /// lookup answers without hashing the id or taking a lock. Most of the time nothing is
    /// denied, and then a request's lookup is this one load.
    live_until_ms: AtomicU64,
}

impl DenyCache {
    /// A cache of `slots` slots (0: off).
    pub fn new(slots: u32) -> DenyCache {
        DenyCache {
            slots: (0..slots).map(|_| Mutex::new(None)).collect(),
            live_until_ms: AtomicU64::new(0),
        }
    }

    /// Whether the cache is on.
    pub fn enabled(&self) -> bool {
        !self.slots.is_empty()
    }

    /// The slot `slot_of` picks among this cache's slots (given how many there are).
    fn slot(&self, slot_of: impl FnOnce(u32) -> u32) -> Option<&Mutex<Option<Entry>>> {
        let count = u32::try_from(self.slots.len()).ok()?;
        self.slots.get(usize::try_from(slot_of(count)).ok()?)
    }

    /// The live denial of `id`, if the cache holds one at `now_ms`.
    pub fn lookup(&self, id: EntryId<'_>, now_ms: u64) -> Option<Entry> {
        // Relaxed: a lookup that reads the bound before another worker raises it misses a
        // denial remembered at that very moment, as a lookup a moment earlier would; that
        // costs a callout, never a wrong answer.
        if self.live_until_ms.load(Ordering::Relaxed) <= now_ms {
            return None;
        }
        // A poisoned slot (a panic while it was held) still holds a whole entry: writes are
        // one assignment.
        let slot = self
            .slot(|count| slot_of(id, count))?
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        slot.as_ref()
            .filter(|entry| id.is(&entry.id) && entry.until_ms > now_ms)
            .cloned()
    }

    /// Remembers a denial, unless its slot holds one that lasts longer.
    pub fn remember(&self, entry: &Entry, now_ms: u64) {
        let Some(slot) = self.slot(|count| slot_of_written(&entry.id, count)) else {
            return;
        };
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        if entry.should_replace(slot.as_ref(), now_ms) {
            self.live_until_ms
                .fetch_max(entry.until_ms, Ordering::Relaxed);
            *slot = Some(entry.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::deny_cache::{Entry, EntryId, slot_of};
    use sluice_core::key::{LimitKey, RuleName};

    use super::DenyCache;

    fn denial(rule: &str, key: &str, until_ms: u64) -> Entry {
        Entry {
            id: format!("{rule}:{key}"),
            until_ms,
            reset_at_ms: until_ms,
            limit: 10,
        }
    }

    fn names(rule: &str, key: &str) -> (RuleName, LimitKey) {
        (
            RuleName::new(rule).expect("a rule name"),
            LimitKey::from_parts([key.as_bytes()]),
        )
    }

    #[test]
    fn a_denial_is_found_by_its_check_until_it_lapses() {
        let cache = DenyCache::new(64);
        cache.remember(&denial("per-ip", "a", 1_000), 0);
        let (rule, a) = names("per-ip", "a");
        let (_, b) = names("per-ip", "b");
        assert_eq!(
            cache
                .lookup(EntryId::new(&rule, &a), 999)
                .map(|e| e.until_ms),
            Some(1_000)
        );
        assert!(
            cache.lookup(EntryId::new(&rule, &a), 1_000).is_none(),
            "lapsed"
        );
        assert!(
            cache.lookup(EntryId::new(&rule, &b), 0).is_none(),
            "another key"
        );
    }

    #[test]
    fn a_slot_keeps_the_longer_denial_and_an_id_never_answers_for_another() {
        // One slot: every id shares it.
        let cache = DenyCache::new(1);
        cache.remember(&denial("per-ip", "a", 5_000), 0);
        cache.remember(&denial("per-ip", "b", 2_000), 0);
        let (rule, a) = names("per-ip", "a");
        let (_, b) = names("per-ip", "b");
        assert!(
            cache.lookup(EntryId::new(&rule, &a), 10).is_some(),
            "the longer stays"
        );
        assert!(cache.lookup(EntryId::new(&rule, &b), 10).is_none());
    }

    #[test]
    fn a_denial_is_found_while_a_longer_one_of_another_key_lives() {
        let cache = DenyCache::new(64);
        let (rule, long) = names("per-ip", "long");
        let short = (0..)
            .map(|i| LimitKey::from_parts([format!("short-{i}").as_bytes()]))
            .find(|key| {
                slot_of(EntryId::new(&rule, key), 64) != slot_of(EntryId::new(&rule, &long), 64)
            })
            .expect("a key in another slot");
        cache.remember(&denial("per-ip", long.as_str(), 9_000), 0);
        cache.remember(&denial("per-ip", short.as_str(), 1_000), 0);
        assert_eq!(
            cache
                .lookup(EntryId::new(&rule, &short), 999)
                .map(|e| e.until_ms),
            Some(1_000)
        );
        assert!(cache.lookup(EntryId::new(&rule, &short), 1_000).is_none());
        assert!(cache.lookup(EntryId::new(&rule, &long), 8_999).is_some());
        assert!(
            cache.lookup(EntryId::new(&rule, &long), 9_000).is_none(),
            "past every denial"
        );
    }

    #[test]
    fn no_slots_is_no_cache() {
        let cache = DenyCache::new(0);
        assert!(!cache.enabled());
        cache.remember(&denial("per-ip", "a", 5_000), 0);
        let (rule, a) = names("per-ip", "a");
        assert!(cache.lookup(EntryId::new(&rule, &a), 0).is_none());
    }
}
