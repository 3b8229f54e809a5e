//! The local deny cache's slots: which slot a key lives in and what a slot holds.
//!
//! Envoy's shared data never forgets a key, so a cache keyed by client would grow with every
//! address an attacker rotates through. The cache is therefore direct-mapped: a fixed number of
//! slots, a key hashed to one of them, the full key stored in the slot and checked on read. A
//! newer denial for another key takes the slot over; a lost entry only costs one callout.
//!
//! The filter does the shared-data reads and compare-and-swap writes; this module is the pure
//! part: slot names, encoding, and which of two entries to keep.

use std::hash::Hasher;

use sha2::{Digest, Sha256};

use crate::decimal;
use crate::key::{LimitKey, RuleName};
use crate::verdict::Verdict;

/// One remembered denial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `<rule>:<key>` of the denied check.
    pub id: String,
    /// Host time (ms since the epoch) until which the key is denied.
    pub until_ms: u64,
    /// Host time at which the rule's limit is fully restored (for the reset header).
    pub reset_at_ms: u64,
    /// The rule's capacity (for the limit header).
    pub limit: u64,
}

/// The identity of a check in the cache: `<rule>:<key>`.
pub fn entry_id(rule: &RuleName, key: &LimitKey) -> String {
    EntryId::new(rule, key).to_owned_id()
}

/// A check's identity in the cache, borrowed from the check: looking an entry up builds no
/// string (this runs for every check of every request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryId<'a> {
    rule: &'a str,
    key: &'a str,
}

impl<'a> EntryId<'a> {
    /// The identity of rule `rule`'s check of `key`.
    pub fn new(rule: &'a RuleName, key: &'a LimitKey) -> EntryId<'a> {
        EntryId {
            rule: rule.as_str(),
            key: key.as_str(),
        }
    }

    /// Whether `id` (as [`entry_id`] writes it) is this identity.
    pub fn is(&self, id: &str) -> bool {
        id.len() == self.rule.len() + 1 + self.key.len()
            && id.starts_with(self.rule)
            && id.as_bytes().get(self.rule.len()) == Some(&b':')
            && id.ends_with(self.key)
    }

    /// The identity as an entry stores it.
    pub fn to_owned_id(&self) -> String {
        let mut id = String::with_capacity(self.rule.len() + 1 + self.key.len());
        id.push_str(self.rule);
        id.push(':');
        id.push_str(self.key);
        id
    }
}

/// The shared-data keys of `slots` slots for the configuration whose fingerprint is
/// `fingerprint` (so that two configurations never read each other's entries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotKeys {
    /// `sluice.<fingerprint>.deny.`, written once rather than for every check.
    prefix: String,
    slots: u32,
}

impl SlotKeys {
    /// The keys of `slots` slots (at least one).
    pub fn new(fingerprint: &str, slots: u32) -> SlotKeys {
        SlotKeys {
            prefix: format!("sluice.{fingerprint}.deny."),
            slots: slots.max(1),
        }
    }

    /// The key of the slot `id` maps to.
    pub fn key(&self, id: &str) -> String {
        self.key_of_parts(&[id.as_bytes()])
    }

    /// The key of a slot of `id`'s own, for a store that can remove keys: no other id's,
    /// and no numbered slot's (an id holds a `:`).
    pub fn own_key(&self, id: &str) -> String {
        let mut key = String::with_capacity(self.prefix.len() + id.len());
        key.push_str(&self.prefix);
        key.push_str(id);
        key
    }

    /// The key of the slot the check `id` maps to: the same as [`SlotKeys::key`] of its
    /// written form, without writing it.
    pub fn key_of(&self, id: EntryId<'_>) -> String {
        self.key_of_parts(&[id.rule.as_bytes(), b":", id.key.as_bytes()])
    }

    /// The key of the slot of the id that is `parts` joined.
    fn key_of_parts(&self, parts: &[&[u8]]) -> String {
        let slot = slot_of_parts(parts, self.slots);
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(slot);
        let mut key = String::with_capacity(self.prefix.len() + digits.len());
        key.push_str(&self.prefix);
        key.push_str(digits);
        key
    }
}

/// The slot, of `slots` (at least one), that the check `id` maps to: the one whose key
/// [`SlotKeys::key_of`] names, for a cache kept in process memory rather than shared data.
pub fn slot_of(id: EntryId<'_>, slots: u32) -> u32 {
    slot_of_parts(&[id.rule.as_bytes(), b":", id.key.as_bytes()], slots.max(1))
}

/// The slot, of `slots`, of an id as [`entry_id`] writes it: the same as [`slot_of`] its
/// [`EntryId`].
pub fn slot_of_written(id: &str, slots: u32) -> u32 {
    slot_of_parts(&[id.as_bytes()], slots.max(1))
}

/// The slot of the id that is `parts` joined.
fn slot_of_parts(parts: &[&[u8]], slots: u32) -> u32 {
    // FNV-1a: every worker must pick the same slot for an id, so the hash is fixed (no random
    // seed); it runs on every request, so it is a cheap one. A client choosing keys that
    // collide only evicts its own entries, which costs callouts, never a wrong answer. It
    // hashes byte by byte, so parts hash as their concatenation does.
    let mut hasher = fnv::FnvHasher::default();
    for part in parts {
        hasher.write(part);
    }
    // Below `slots`, so always a u32.
    u32::try_from(hasher.finish() % u64::from(slots)).unwrap_or(0)
}

/// A short, stable fingerprint of a configuration's bytes.
pub fn fingerprint(configuration: &[u8]) -> String {
    let digest = Sha256::digest(configuration);
    crate::hex::lower_hex(&digest[..6])
}

impl Entry {
    /// The entry that remembers check `id`'s denial `verdict`, answered at `at_ms`: until the
    /// verdict's retry time, and never longer than `longest_ms` (the limit's own longest wait,
    /// where the caller knows it: a verdict claiming more, from a lagging clock or garbage,
    /// would otherwise deny the key here with nothing to correct it). None for a verdict that
    /// admits, or whose denial no wait lifts.
    pub fn of_denial(id: String, verdict: &Verdict, at_ms: u64, longest_ms: u64) -> Option<Entry> {
        if verdict.allowed {
            return None;
        }
        let retry_ms = verdict.retry_after_ms?;
        Some(Entry {
            id,
            until_ms: at_ms.saturating_add(retry_ms.min(longest_ms)),
            reset_at_ms: at_ms.saturating_add(verdict.reset_ms.min(longest_ms)),
            limit: verdict.limit,
        })
    }

    /// The denial the entry answers at `now_ms`, while it lives (`now_ms < until_ms`).
    pub fn denial_at(&self, now_ms: u64) -> Verdict {
        Verdict {
            allowed: false,
            limit: self.limit,
            remaining: 0,
            reset_ms: self.reset_at_ms.saturating_sub(now_ms),
            retry_after_ms: Some(self.until_ms.saturating_sub(now_ms)),
            delay_ms: 0,
        }
    }

    /// `until|reset_at|limit|id`.
    pub fn encode(&self) -> Vec<u8> {
        decimal::write_record(&[self.until_ms, self.reset_at_ms, self.limit], &self.id)
    }

    /// Reads a slot's bytes; `None` for anything malformed (the slot is then treated as empty).
    pub fn decode(bytes: &[u8]) -> Option<Entry> {
        let ([until_ms, reset_at_ms, limit], id) = decimal::read_record(bytes)?;
        Some(Entry {
            until_ms,
            reset_at_ms,
            limit,
            id: id.to_owned(),
        })
    }

    /// The entry in a slot's `bytes` if it denies `id` at `now_ms`: what a lookup needs,
    /// without building an entry for a slot that holds another key or an expired denial.
    pub fn decode_denying(bytes: &[u8], id: EntryId<'_>, now_ms: u64) -> Option<Entry> {
        let ([until_ms, reset_at_ms, limit], written_id) = decimal::read_record(bytes)?;
        (now_ms < until_ms && id.is(written_id)).then(|| Entry {
            until_ms,
            reset_at_ms,
            limit,
            id: written_id.to_owned(),
        })
    }

    /// Whether writing `self` over `current` loses nothing worth more: a live entry for the same
    /// key that lasts longer is kept.
    pub fn should_replace(&self, current: Option<&Entry>, now_ms: u64) -> bool {
        match current {
            Some(c) if c.id == self.id && c.until_ms >= self.until_ms => false,
            Some(c) if c.id != self.id && c.until_ms > now_ms && c.until_ms >= self.until_ms => {
                // Another key's denial that outlasts ours keeps the slot.
                false
            }
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, until_ms: u64) -> Entry {
        Entry {
            id: id.into(),
            until_ms,
            reset_at_ms: until_ms + 5,
            limit: 10,
        }
    }

    fn denied(retry_after_ms: Option<u64>, reset_ms: u64) -> Verdict {
        Verdict {
            allowed: false,
            limit: 10,
            remaining: 0,
            reset_ms,
            retry_after_ms,
            delay_ms: 0,
        }
    }

    #[test]
    fn a_remembered_denial_answers_what_is_left_of_its_wait_capped_at_the_longest() {
        let remembered = Entry::of_denial("r:k".into(), &denied(Some(700), 900), 1_000, 60_000)
            .expect("a denial with a wait");
        assert_eq!(
            (remembered.until_ms, remembered.reset_at_ms),
            (1_700, 1_900)
        );
        let later = remembered.denial_at(1_500);
        assert!(!later.allowed);
        assert_eq!(
            (later.retry_after_ms, later.reset_ms, later.limit),
            (Some(200), 400, 10)
        );
        // A wait longer than the limit's own is cut to it.
        let capped = Entry::of_denial("r:k".into(), &denied(Some(3_600_000), 3_600_000), 0, 2_000)
            .expect("a denial with a wait");
        assert_eq!((capped.until_ms, capped.reset_at_ms), (2_000, 2_000));
        // Nothing to remember: no wait lifts it, or it admitted.
        assert!(Entry::of_denial("r:k".into(), &denied(None, 0), 0, u64::MAX).is_none());
        let admitted = Verdict {
            allowed: true,
            ..denied(Some(0), 0)
        };
        assert!(Entry::of_denial("r:k".into(), &admitted, 0, u64::MAX).is_none());
    }

    #[test]
    fn entries_round_trip_and_junk_is_empty() {
        let e = entry("per-ip:1.2.3.4|x", 1000);
        assert_eq!(Entry::decode(&e.encode()), Some(e));
        assert_eq!(Entry::decode(b"garbage"), None);
        assert_eq!(Entry::decode(&[0xff, b'|']), None);
    }

    #[test]
    fn slot_keys_name_the_configuration_and_the_slot() {
        assert_eq!(SlotKeys::new("abc", 1).key("r:1"), "sluice.abc.deny.0");
        let mut hasher = fnv::FnvHasher::default();
        hasher.write(b"r:1");
        let expected = hasher.finish() % 4_000_000_000;
        assert_eq!(
            SlotKeys::new("abc", 4_000_000_000).key("r:1"),
            format!("sluice.abc.deny.{expected}")
        );
        assert_eq!(
            entry_id(
                &RuleName::new("r").unwrap(),
                &LimitKey::from_parts([b"k".as_slice()])
            ),
            "r:k"
        );
    }

    #[test]
    fn an_entry_denies_only_its_key_and_only_until_its_time() {
        let keys = SlotKeys::new("f", 1000);
        let rule = RuleName::new("per-ip").unwrap();
        for parts in [["1.2.3.4"], [""], ["a:b"]] {
            let key = LimitKey::from_parts(parts.map(str::as_bytes));
            let id = EntryId::new(&rule, &key);
            let written = entry_id(&rule, &key);
            assert!(id.is(&written));
            assert_eq!(keys.key_of(id), keys.key(&written));
            let e = entry(&written, 1000);
            assert_eq!(Entry::decode_denying(&e.encode(), id, 999), Some(e.clone()));
            assert_eq!(
                Entry::decode_denying(&e.encode(), id, 1000),
                None,
                "expired"
            );
        }
        let key = LimitKey::from_parts([b"k".as_slice()]);
        let id = EntryId::new(&rule, &key);
        for other in [
            "per-ip:kk",
            "per-ip;k",
            "per-i:k",
            "per-ip:",
            "xper-ip:k",
            "per-ip:k:",
        ] {
            assert!(!id.is(other), "{other}");
            let e = entry(other, 1000);
            assert_eq!(Entry::decode_denying(&e.encode(), id, 0), None, "{other}");
        }
    }

    #[test]
    fn slots_are_bounded_and_stable() {
        let slots: std::collections::HashSet<String> = (0..10_000)
            .map(|i| SlotKeys::new("f", 64).key(&format!("r:{i}")))
            .collect();
        assert_eq!(slots.len(), 64);
        assert_eq!(
            SlotKeys::new("f", 64).key("r:1"),
            SlotKeys::new("f", 64).key("r:1")
        );
    }

    #[test]
    fn a_longer_denial_is_not_overwritten_by_a_shorter_one() {
        let long = entry("r:a", 5000);
        assert!(!entry("r:a", 3000).should_replace(Some(&long), 100));
        assert!(entry("r:a", 6000).should_replace(Some(&long), 100));
        assert!(
            entry("r:b", 3000).should_replace(Some(&entry("r:a", 50)), 100),
            "expired entries give way"
        );
        assert!(entry("r:b", 3000).should_replace(None, 100));
    }
}
