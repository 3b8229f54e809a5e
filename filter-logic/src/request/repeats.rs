//! A worker's decisions that a later request may repeat: those of requests admitted at once
//! from allowances alone, by their checks.
//!
//! Until a hot key's lease is renewed, its requests plan the same checks and find the same
//! verdicts in their allowances (what the server had left at the grant), so each is decided,
//! counted and recorded as the last one of that key was: `conclude` is a function of the
//! checks, their verdicts and the policy. A host that keeps [`Repeats`] for each worker
//! decides such a request without concluding or writing its record anew. Kept by the worker,
//! not the stream: requests of a few hot keys interleave, and a stream's last request was
//! seldom of the same key (Envoy evicts the code between requests, and every line of it run
//! costs a cache miss).

use std::hash::{BuildHasher, Hasher};

use sluice_core::policy::PlannedCheck;
use sluice_core::verdict::Verdict;

use crate::lease::PurseHasher;

/// How many decisions a worker keeps, each in the slot its checks hash to: a few dozen hot
/// keys a worker rarely share one.
const SLOTS: usize = 256;

/// A worker's repeatable decisions, for every policy it serves.
pub struct Repeats {
    slots: Box<[Decided]>,
    /// The slot last found or kept, looked at before any is hashed: a key's requests often
    /// come one after another.
    last: usize,
    hasher: PurseHasher,
    /// How many requests repeated a kept decision, for tests to tell.
    #[cfg(test)]
    pub(super) hits: usize,
}

/// One request's checks, their verdicts, and what its conclusion left.
#[derive(Default)]
pub(super) struct Decided {
    /// The policy's id (see [`Repeats::of`]); 0 while the slot holds none.
    policy: u64,
    pub(super) planned: Vec<PlannedCheck>,
    pub(super) local: Vec<Option<Verdict>>,
    pub(super) record: Vec<u8>,
    pub(super) headers: Vec<(String, String)>,
}

impl Default for Repeats {
    fn default() -> Repeats {
        Repeats {
            slots: (0..SLOTS).map(|_| Decided::default()).collect(),
            last: 0,
            hasher: PurseHasher::default(),
            #[cfg(test)]
            hits: 0,
        }
    }
}

impl Repeats {
    /// These repeats for the requests of one policy, which the host knows by `policy`: an id
    /// no other policy the process serves has had or will have (a configuration made anew,
    /// even at the same address, gets another), never 0.
    pub fn of(&mut self, policy: u64) -> Repeating<'_> {
        Repeating {
            repeats: self,
            policy,
            hashed: None,
        }
    }

    /// The slot `planned` checks hash to. Their keys alone are hashed: checks of two rules
    /// with one key share a slot, which repeats a decision only for the very checks it was
    /// kept for.
    fn slot_of(&self, planned: &[PlannedCheck]) -> usize {
        let mut hasher = self.hasher.build_hasher();
        for check in planned {
            hasher.write(check.key.as_str().as_bytes());
        }
        hasher.finish() as usize % SLOTS
    }
}

impl Decided {
    #[inline(always)]
    fn holds(&self, policy: u64, planned: &[PlannedCheck], local: &[Option<Verdict>]) -> bool {
        self.policy == policy && self.planned == planned && self.local == local
    }
}

/// A worker's [`Repeats`] for one policy's requests.
pub struct Repeating<'a> {
    repeats: &'a mut Repeats,
    policy: u64,
    /// The slot the checks [`Repeating::find`] looked for hash to, once it hashed them: where
    /// [`Repeating::keep`] keeps their decision, without hashing them again.
    hashed: Option<usize>,
}

impl Repeating<'_> {
    /// The decision kept for `planned` checks with `local` verdicts, if one is.
    // Inlined: on a hot key's request its first look finds it, and a call was a tenth of it.
    #[inline(always)]
    pub(super) fn find(
        &mut self,
        planned: &[PlannedCheck],
        local: &[Option<Verdict>],
    ) -> Option<&Decided> {
        // An empty slot's policy: nothing is kept under it. And a decision is kept only for
        // checks all decided here: a request with a check to ask about (every request of a
        // policy without leases) has none to find, and its keys are not hashed.
        if self.policy == 0 || local.iter().any(Option::is_none) {
            return None;
        }
        let repeats = &mut *self.repeats;
        if !repeats.slots[repeats.last].holds(self.policy, planned, local) {
            let slot = repeats.slot_of(planned);
            self.hashed = Some(slot);
            if !repeats.slots[slot].holds(self.policy, planned, local) {
                return None;
            }
            repeats.last = slot;
        }
        #[cfg(test)]
        {
            repeats.hits += 1;
        }
        Some(&repeats.slots[repeats.last])
    }

    /// Keeps a decision's `planned` checks, `local` verdicts, `record` and `headers` for the
    /// requests to come, and leaves in the first three those of the decision it replaces, as
    /// buffers to reuse: the request decided reads them no more. The checks are those
    /// [`Repeating::find`] looked for last, if it looked.
    pub(super) fn keep(
        &mut self,
        planned: &mut Vec<PlannedCheck>,
        local: &mut Vec<Option<Verdict>>,
        record: &mut Vec<u8>,
        headers: &Vec<(String, String)>,
    ) {
        let index = match self.hashed.take() {
            Some(index) => index,
            None => self.repeats.slot_of(planned),
        };
        self.repeats.last = index;
        let slot = &mut self.repeats.slots[index];
        // Unclaimed while it changes: a panic between the swaps leaves it holding nothing.
        slot.policy = 0;
        std::mem::swap(&mut slot.planned, planned);
        std::mem::swap(&mut slot.local, local);
        std::mem::swap(&mut slot.record, record);
        // Copied, not swapped: the request's response still needs its own.
        copy_headers(&mut slot.headers, headers);
        slot.policy = self.policy;
    }
}

/// Makes `into` a copy of `from`, in the strings `into` holds where it can.
// Inlined down to its first test: a leased request's call went through a prologue and missed
// in four cache lines to clear an empty list.
#[inline(always)]
pub(super) fn copy_headers(into: &mut Vec<(String, String)>, from: &Vec<(String, String)>) {
    // Nearly always: the policy adds no headers to an admitted request's response.
    if from.is_empty() {
        into.clear();
    } else {
        copy_some_headers(into, from);
    }
}

#[cold]
fn copy_some_headers(into: &mut Vec<(String, String)>, from: &Vec<(String, String)>) {
    into.clone_from(from);
}
