//! What one worker remembers of its leases: the allowances it used, the asks it marked and
//! sent, units with no allowance to go to, and its purses.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use sluice_core::key::{LimitKey, RuleName};
use sluice_core::lease::Purse;

/// The hasher of the purses' maps, looked up on every leased request. Natively foldhash,
/// seeded per process (a key is a client's value, so the seed keeps collisions out of its
/// reach), where std's SipHash took about 250 instructions a take; in the .wasm std's, whose
/// code the .wasm carries already.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) type PurseHasher = foldhash::fast::RandomState;
/// See the native definition.
#[cfg(target_arch = "wasm32")]
pub(crate) type PurseHasher = std::collections::hash_map::RandomState;

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
    /// then the tick leaves its slot alone, unless it was asked for. Set through
    /// [`WorkerState::look_at`] or [`WorkerState::touch`], which keep [`Looks`] in step.
    pub(super) look_at_us: u64,
    /// The time of its live entry in [`Looks`], at or before `look_at_us`; [`UNQUEUED`]
    /// before it is first queued, and while [`WorkerState::due`] holds it out of the queue.
    pub(super) queued_us: u64,
    /// During a tick, the marks `wanted` holds for it. Kept here, not in a set of their own,
    /// for lookups without comparing every mark with every allowance (37 ms a tick at 20,000
    /// keys, under the lock every worker's take needs in the module), and without another
    /// collection's code in the .wasm.
    pub(super) marks: TickMarks,
}

impl Touched {
    /// Allowance `id` of rule `rule` (`name`) for `key`, first used: its look is set, and
    /// queued, by [`WorkerState::touch`].
    pub(super) fn new(rule: usize, name: RuleName, key: LimitKey, id: String) -> Touched {
        Touched {
            rule,
            name,
            key,
            id,
            look_at_us: UNQUEUED,
            queued_us: UNQUEUED,
            marks: TickMarks::default(),
        }
    }
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

/// A [`Touched`] with no entry in [`Looks`].
const UNQUEUED: u64 = u64::MAX;

/// The allowances' looks to come, soonest first, so that a tick finds those due without
/// walking every allowance (0.15 ms a tick at 20,000 keys, under the lock every worker's take
/// needs in the module). An entry is live while its time is its allowance's `queued_us`; the
/// others (a look brought forward, a forgotten allowance) are dropped as they come due.
/// Entries are not moved later as an allowance's look is put off: a live one that comes due
/// early is queued again at the allowance's time.
#[derive(Default)]
pub(super) struct Looks(BinaryHeap<Reverse<Look>>);

/// An entry of [`Looks`]: ordered by its time alone, since thousands of allowances used at
/// one instant would otherwise be ordered by comparing their slots' names.
pub(super) struct Look {
    at_us: u64,
    slot: String,
}

impl Ord for Look {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.at_us.cmp(&other.at_us)
    }
}

impl PartialOrd for Look {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Look {
    fn eq(&self, other: &Self) -> bool {
        self.at_us == other.at_us
    }
}

impl Eq for Look {}

impl Looks {
    /// Sets `touched`'s look, in `slot`, to `at_us`. A look put off keeps the entry it has,
    /// queued again when it comes due.
    fn look_at(&mut self, touched: &mut Touched, slot: &str, at_us: u64) {
        touched.look_at_us = at_us;
        if at_us < touched.queued_us {
            self.queue(touched, slot.to_owned(), at_us);
        }
    }

    /// Queues `touched`, in `slot`, at `at_us`.
    fn queue(&mut self, touched: &mut Touched, slot: String, at_us: u64) {
        touched.queued_us = at_us;
        self.0.push(Reverse(Look { at_us, slot }));
    }

    /// The soonest entry, out of the queue, if it is due at `now_us`.
    fn pop_due(&mut self, now_us: u64) -> Option<Look> {
        if self.0.peek()?.0.at_us > now_us {
            return None;
        }
        self.0.pop().map(|Reverse(look)| look)
    }

    fn any_due(&self, now_us: u64) -> bool {
        self.0
            .peek()
            .is_some_and(|Reverse(look)| look.at_us <= now_us)
    }
}

#[derive(Default)]
pub(super) struct WorkerState {
    /// By slot key: the allowances this worker used, which its tick looks after.
    pub(super) touched: HashMap<String, Touched, PurseHasher>,
    /// When to look at each of `touched`.
    pub(super) looks: Looks,
    /// The ticks begun, to tell their marks apart ([`TickMarks`]).
    pub(super) ticks: u64,
    /// Slot keys this worker marked as asked for, with the mark's time, to ask at the next
    /// tick if the mark is still the one in force. A tick takes the first few off the front
    /// and puts back those it left out: with thousands waiting, a `Vec` moved all of them.
    pub(super) wanted: VecDeque<(String, u64)>,
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
    /// the first use remembers it, as `first` makes it ([`Touched::new`]).
    pub(super) fn touch(&mut self, slot: &str, look_at_us: u64, first: impl FnOnce() -> Touched) {
        match self.touched.get_mut(slot) {
            Some(touched) => self.looks.look_at(touched, slot, look_at_us),
            None => {
                let mut touched = first();
                self.looks.look_at(&mut touched, slot, look_at_us);
                self.touched.insert(slot.to_owned(), touched);
            }
        }
    }

    /// Sets when the tick must next look at the allowance in `slot`, if this worker has it.
    pub(super) fn look_at(&mut self, slot: &str, look_at_us: u64) {
        if let Some(touched) = self.touched.get_mut(slot) {
            self.looks.look_at(touched, slot, look_at_us);
        }
    }

    /// Up to `most` allowances due a look at `now_us` that tick `tick` has not marked, soonest
    /// first; and whether more may be due. They stay queued at their looks, due again at the
    /// next tick unless looking at them puts their looks off: a tick that panics half-way
    /// (the module catches it and goes on) loses none of them.
    pub(super) fn due(&mut self, now_us: u64, tick: u64, most: usize) -> (Vec<String>, bool) {
        // Entries come due for allowances whose look was put off (every one used since it
        // was queued): thousands of them at once after a burst of new keys. Those are queued
        // again, at most this many entries a tick; the rest wait for the next, short, tick.
        let most_popped = 4 * most;
        let mut due = Vec::new();
        // Queued again once the loop is over: queued now, some would come out again.
        let mut again = Vec::new();
        let mut popped = 0;
        while due.len() < most && popped < most_popped {
            let Some(Look { at_us, slot }) = self.looks.pop_due(now_us) else {
                break;
            };
            popped += 1;
            // Not its live entry: the allowance is forgotten, or its look was brought forward.
            let Some(touched) = self.touched.get_mut(&slot).filter(|t| t.queued_us == at_us) else {
                continue;
            };
            touched.queued_us = UNQUEUED;
            // Due, unless put off since it was queued or looked at this tick for its marks.
            if touched.look_at_us <= now_us && touched.marks.of(tick).is_empty() {
                due.push(slot.clone());
            }
            again.push(slot);
        }
        // Read before those taken out go back, some of them due still.
        let more = self.looks.any_due(now_us);
        for slot in again {
            self.requeue(slot);
        }
        (due, more)
    }

    /// Queues the allowance in `slot` again at its look, where [`WorkerState::due`] took it
    /// out of the queue.
    fn requeue(&mut self, slot: String) {
        if let Some(touched) = self.touched.get_mut(&slot)
            && touched.queued_us == UNQUEUED
        {
            let at_us = touched.look_at_us;
            self.looks.queue(touched, slot, at_us);
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
