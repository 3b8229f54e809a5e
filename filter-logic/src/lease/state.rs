//! What one worker remembers of its leases: the allowances it used, the asks it marked and
//! sent, units with no allowance to go to, and its purses.

use std::collections::{BTreeMap, HashMap};

use sluice_core::key::{LimitKey, RuleName};
use sluice_core::lease::Purse;

/// The hasher of the purses' maps, looked up on every leased request. Natively foldhash,
/// seeded per process (a key is a client's value, so the seed keeps collisions out of its
/// reach), where std's SipHash took about 250 instructions a take; in the .wasm std's, whose
/// code the .wasm carries already.
#[cfg(not(target_arch = "wasm32"))]
pub(super) type PurseHasher = foldhash::fast::RandomState;
/// See the native definition.
#[cfg(target_arch = "wasm32")]
pub(super) type PurseHasher = std::collections::hash_map::RandomState;

/// One rule's purses, by key.
pub(super) type Purses = HashMap<String, Pursed, PurseHasher>;

/// An ask on its way, to apply its answer.
pub(super) struct Sent {
    /// The allowance's slot; empty for units given back that have none.
    pub(super) slot: String,
    pub(super) id: String,
    pub(super) rule: usize,
    pub(super) name: RuleName,
    pub(super) key: LimitKey,
    pub(super) asked_at_us: u64,
    pub(super) returning: u64,
    pub(super) lease_until_us: u64,
}

impl Sent {
    /// The units it gave back, to give back again (while their lease lasts).
    pub(super) fn orphan(&self) -> Orphan {
        Orphan {
            rule: self.rule,
            name: self.name.clone(),
            key: self.key.clone(),
            units: self.returning,
            lease_until_us: self.lease_until_us,
        }
    }
}

/// A worker's record of an allowance it has used.
pub(super) struct Touched {
    pub(super) rule: usize,
    pub(super) name: RuleName,
    pub(super) key: LimitKey,
    pub(super) id: String,
    /// When the tick must next look at it (its lease about to end, or long unused): until
    /// then the tick leaves its slot alone, unless it was asked for.
    pub(super) look_at_us: u64,
    /// During a tick, the marks `wanted` holds for it. Kept here, not in a set of their own,
    /// for lookups without comparing every mark with every allowance (37 ms a tick at 20,000
    /// keys, under the lock every worker's take needs in the module), and without another
    /// collection's code in the .wasm.
    pub(super) marks: TickMarks,
}

/// An allowance's marks during one tick: (where in `wanted`, the mark's time). Those of an
/// earlier tick count for none: a tick that panicked (the module catches it and goes on) left
/// them, and they would keep the allowance from every later look.
#[derive(Default)]
pub(super) struct TickMarks {
    tick: u64,
    marks: Vec<(usize, u64)>,
}

impl TickMarks {
    /// Notes a mark at `place` in `wanted`, made at `at`, for tick `tick`.
    pub(super) fn note(&mut self, tick: u64, place: usize, at: u64) {
        if self.tick != tick {
            self.tick = tick;
            self.marks.clear();
        }
        self.marks.push((place, at));
    }

    /// The marks of tick `tick`, first marked first.
    pub(super) fn of(&self, tick: u64) -> &[(usize, u64)] {
        if self.tick == tick { &self.marks } else { &[] }
    }

    /// The marks of tick `tick`, taken: each is dealt with once.
    pub(super) fn take(&mut self, tick: u64) -> Vec<(usize, u64)> {
        if self.tick == tick {
            std::mem::take(&mut self.marks)
        } else {
            Vec::new()
        }
    }
}

/// Units granted or given back that have no allowance to go to: given back at the next tick.
pub(super) struct Orphan {
    pub(super) rule: usize,
    pub(super) name: RuleName,
    pub(super) key: LimitKey,
    pub(super) units: u64,
    pub(super) lease_until_us: u64,
}

#[derive(Default)]
pub(super) struct WorkerState {
    /// By slot key: the allowances this worker used, which its tick looks after.
    pub(super) touched: BTreeMap<String, Touched>,
    /// The ticks begun, to tell their marks apart ([`TickMarks`]).
    pub(super) ticks: u64,
    /// Slot keys this worker marked as asked for, with the mark's time, to ask at the next
    /// tick if the mark is still the one in force.
    pub(super) wanted: Vec<(String, u64)>,
    /// A key whose ask waits in `wanted` ran out of units: its requests go to the server
    /// until the ask is answered, so the asks go at the next short tick, not the next tick.
    pub(super) short_of_units: bool,
    /// More leases were due a look than the last tick looked at: the next tick is a short one.
    pub(super) more_due: bool,
    /// By callout token.
    pub(super) in_flight: HashMap<u64, Vec<Sent>>,
    pub(super) orphans: Vec<Orphan>,
    /// By rule index, then by key: this worker's purses.
    pub(super) purses: Vec<Purses>,
}

impl WorkerState {
    /// Rule `rule`'s purses.
    pub(super) fn purses_of(&mut self, rule: usize) -> &mut Purses {
        if self.purses.len() <= rule {
            self.purses.resize_with(rule + 1, Purses::default);
        }
        &mut self.purses[rule]
    }

    /// Rule `rule`'s purse of `key`, out of its map for a refill, with the map's own string of
    /// the key, to put it back under with no allocation.
    pub(super) fn take_purse(&mut self, rule: usize, key: &LimitKey) -> Option<(String, Pursed)> {
        self.purses.get_mut(rule)?.remove_entry(key.as_str())
    }

    /// Notes that the allowance in `slot` was used and when the tick must next look at it;
    /// the first use remembers it, as `first` makes it.
    pub(super) fn touch(&mut self, slot: &str, look_at_us: u64, first: impl FnOnce() -> Touched) {
        match self.touched.get_mut(slot) {
            Some(t) => t.look_at_us = look_at_us,
            None => {
                self.touched.insert(slot.to_owned(), first());
            }
        }
    }
}

/// A worker's purse and where its units came from.
pub(super) struct Pursed {
    /// The allowance's id.
    pub(super) id: String,
    /// The allowance's slot.
    pub(super) slot: String,
    pub(super) purse: Purse,
}
