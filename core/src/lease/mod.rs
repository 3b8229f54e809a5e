//! Lease mode: units of a rule's limit that sluice-server hands to one Envoy ahead of need, so
//! that Envoy decides most requests itself, with no callout.
//!
//! A lease is taken out of the very Redis state a per-request decision uses, by the same
//! algorithm, atomically, never more than the algorithm would admit at that instant. The Envoy
//! (the *holder*) keeps its units in proxy-wasm shared data, one [`Allowance`] per rule and key,
//! shared by all its workers, and spends them with compare-and-swap, so no unit is spent
//! twice (a worker moves a few at a time into its own [`Purse`], spent with no host call). It asks for more ahead of need, from its observed local rate; it gives back what it
//! does not use. sluice-server keeps a ledger per key: what each holder holds (until its lease
//! ends) and a *pool* of units given back, which the next grant to any holder takes first.
//!
//! # The bound
//!
//! Every unit spent was admitted by the algorithm at the moment it was granted, and a holder
//! spends it later, before its lease ends. So the units admitted in any interval `[a, a + T]`
//! are those granted in it, at most the algorithm's own bound for `T`, plus those granted
//! before `a` and spent after: at most what was outstanding at `a`, which the ledger caps at
//! [`LeaseTerms::max_outstanding`]. **Admissions in any interval `T` are at most the algorithm's
//! bound for `T` plus `max_outstanding`.**
//!
//! What may be denied that a per-request decision would admit: units stranded at a holder
//! whose traffic stopped, until it gives them back as its lease ends (a holder renews the
//! lease of a key it still uses, and gives back the units of one that went quiet); at most
//! `max_units` per holder and key, for at most one `ttl`. A holder that stops
//! without giving back (a crash) strands what it held until the algorithm itself restores it
//! (its window ends, its bucket refills): the server cannot know how much of it was spent.
//!
//! ```
//! use sluice_core::lease::{Allowance, Take};
//! use sluice_core::wire::LeaseGrant;
//! let mut a = Allowance::new("per-tenant:acme");
//! // 10 units for an ask of 10 sent at 0 µs, for a lease of 500 ms.
//! let grant = LeaseGrant { granted: 10, lease_ms: 500, more_in_ms: 0, limit: 100, remaining: 90, pace_us: 0, kept: None, share_per_ks: 0, crowded: false };
//! a.grant(0, &grant);
//! assert_eq!(a.take(3, 200_000), Take::Taken);
//! assert_eq!(a.units, 7);
//! assert_eq!(a.take(3, 600_000), Take::Short, "the lease ended at 500 ms");
//! ```

use crate::duration::Millis;
use crate::wire::LeaseGrant;
pub use crate::wire::{LeaseTerms, MAX_LEASE_TTL_MS};

mod allowance;
mod purse;

pub use allowance::Allowance;
pub use purse::{PURSE_UNITS, Purse};

/// Slots of allowances in shared data (direct-mapped, as the deny cache's). A key whose slot
/// another busy key holds is decided per request, so the slots must far outnumber the keys
/// leased at once: 1,000 keys in 4,096 slots left about one in nine without a slot (a tenth
/// of their requests went to the server, `make bench`, 2026-11-26); in 65,536, about one in
/// 130. A slot is a shared-data entry only once a key has used it (about 200 bytes). The
/// native module, whose memory can forget a key, gives each key a slot of its own instead, and
/// keeps at most this many.
pub const LEASE_SLOTS: u32 = 65536;
/// The first byte of an allowance's record: a slot holding anything else reads as free. No
/// text starts with it (in UTF-8 it only continues a character), so neither does the decimal
/// record of an earlier build that shares the slot while Envoy swaps configurations.
const RECORD_TAG: u8 = 0xA1;
/// How many numbers an allowance's record holds.
const RECORD_NUMBERS: usize = 12;
/// The record's bytes before the id: its tag and its numbers.
const RECORD_HEAD: usize = 1 + RECORD_NUMBERS * 8;

/// One rule's lease settings, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// How far ahead of need units are asked for: an allowance is refilled when it holds less
    /// than one horizon of the key's local traffic, up to two horizons' worth.
    pub horizon: Millis,
    /// What the server enforces.
    pub terms: LeaseTerms,
}

impl LeaseConfig {
    /// How often a worker looks at its allowances (sends asks and gives back idle units): a
    /// quarter of the horizon, between 5 ms and 100 ms.
    pub fn tick_ms(&self) -> u64 {
        (self.horizon.as_millis() / 4).clamp(5, 100)
    }
}

/// Slots a paced allowance saves up while no request comes: arrivals at random, a little over
/// the pace, then still get all of it, and a key far over its limit, which never has a free
/// slot, is never let through in a bunch.
pub const PACE_SLACK: u64 = 32;

/// The fewest units a key must use in a horizon to be leased: a quieter key's grants would
/// each cover a request or none, so its requests are decided one by one by the server.
pub const LEASED_FROM_UNITS_A_HORIZON: u64 = 2;

/// What [`Allowance::take`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// The units were taken.
    Taken,
    /// The units are there, but the key is contended and the next may be spent only this many
    /// microseconds from now.
    Paced {
        /// Microseconds to wait.
        wait_us: u64,
    },
    /// Not enough units under a live lease.
    Short,
}

impl Allowance {
    /// An empty allowance for `id`.
    pub fn new(id: &str) -> Allowance {
        Allowance {
            id: id.to_owned(),
            units: 0,
            lease_until_us: 0,
            next_ask_us: 0,
            asking_since_us: 0,
            period_start_us: 0,
            seen: 0,
            seen_before: 0,
            last_seen_us: 0,
            pace_us: 0,
            pace_next_us: 0,
            limit: 0,
            remaining: 0,
        }
    }

    /// The slot's bytes: [`RECORD_TAG`], the twelve numbers (`units`, `lease_until_us`,
    /// `next_ask_us`, `asking_since_us`, `period_start_us`, `seen`, `seen_before`,
    /// `last_seen_us`, `pace_us`, `pace_next_us`, `limit`, `remaining`) as 8 bytes each, little
    /// end first, then the id. Fixed-width, not decimal: a take that refills a purse reads and
    /// writes the record, and decimal text cost about 3,100 instructions of the 6,800 such a
    /// take cost in the module (callgrind, 2026-12-03).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(RECORD_HEAD + self.id.len());
        out.push(RECORD_TAG);
        for n in self.numbers() {
            out.extend_from_slice(&n.to_le_bytes());
        }
        out.extend_from_slice(self.id.as_bytes());
        out
    }

    /// Reads a slot's bytes; `None` for anything malformed (the slot is then free).
    pub fn decode(bytes: &[u8]) -> Option<Allowance> {
        let (&tag, rest) = bytes.split_first()?;
        let (numbers, id) = rest.split_at_checked(RECORD_NUMBERS * 8)?;
        if tag != RECORD_TAG {
            return None;
        }
        let mut n = [0u64; RECORD_NUMBERS];
        for (n, field) in n.iter_mut().zip(numbers.chunks_exact(8)) {
            *n = u64::from_le_bytes(field.try_into().ok()?);
        }
        let [
            units,
            lease_until_us,
            next_ask_us,
            asking_since_us,
            period_start_us,
            seen,
            seen_before,
            last_seen_us,
            pace_us,
            pace_next_us,
            limit,
            remaining,
        ] = n;
        Some(Allowance {
            id: std::str::from_utf8(id).ok()?.to_owned(),
            units,
            lease_until_us,
            next_ask_us,
            asking_since_us,
            period_start_us,
            seen,
            seen_before,
            last_seen_us,
            pace_us,
            pace_next_us,
            limit,
            remaining,
        })
    }

    /// The record's numbers, in the order [`Allowance::encode`] writes them.
    fn numbers(&self) -> [u64; RECORD_NUMBERS] {
        [
            self.units,
            self.lease_until_us,
            self.next_ask_us,
            self.asking_since_us,
            self.period_start_us,
            self.seen,
            self.seen_before,
            self.last_seen_us,
            self.pace_us,
            self.pace_next_us,
            self.limit,
            self.remaining,
        ]
    }

    /// Whether its lease is live at `now_us`.
    pub fn leased(&self, now_us: u64) -> bool {
        now_us < self.lease_until_us
    }

    /// The units an ask sent at `now_us` says are held: none once the lease has ended, since
    /// the server counts a holder's units only while their lease lives.
    pub fn held(&self, now_us: u64) -> u64 {
        if self.leased(now_us) { self.units } else { 0 }
    }

    /// Whether the slot may be given to another key at `now_us`: nothing held, nothing asked,
    /// no local denial, and unused for `ttl_us` (so a busy key keeps its slot).
    pub fn is_free(&self, now_us: u64, ttl_us: u64) -> bool {
        (self.units == 0 || !self.leased(now_us))
            && !self.is_asking(now_us, ttl_us)
            && now_us >= self.next_ask_us
            && now_us.saturating_sub(self.last_seen_us) >= ttl_us
    }

    /// Whether an ask is in flight (one older than `ttl_us` is taken as lost).
    pub fn is_asking(&self, now_us: u64, ttl_us: u64) -> bool {
        self.asking_since_us != 0 && now_us.saturating_sub(self.asking_since_us) < ttl_us
    }

    /// Counts a request of `cost` at `now_us` towards the key's local rate.
    pub fn observe(&mut self, cost: u64, now_us: u64, horizon: Millis) {
        let horizon = horizon.as_micros().unsigned_abs();
        let elapsed = now_us.saturating_sub(self.period_start_us);
        if elapsed >= horizon {
            self.seen_before = if elapsed < 2 * horizon { self.seen } else { 0 };
            self.seen = 0;
            self.period_start_us = now_us;
        }
        self.seen = self.seen.saturating_add(cost);
        self.last_seen_us = now_us;
    }

    /// The units the key is expected to use in one horizon: the larger of the last full
    /// period's count and the current one's.
    pub fn expected(&self) -> u64 {
        self.seen.max(self.seen_before)
    }

    /// The key's local demand in units a second, for the server to share the rate by.
    pub fn demand_per_second(&self, horizon: Millis) -> u64 {
        self.expected().saturating_mul(1000) / horizon.as_millis().max(1)
    }

    /// Spends `cost` units if the lease is live and holds them, and, when the key is over its
    /// limit, if this Envoy's pace allows: its fair share of the rate, so that the key's
    /// admissions, summed over Envoys, are as even as the algorithm's, not in a bunch after
    /// each grant.
    pub fn take(&mut self, cost: u64, now_us: u64) -> Take {
        if !self.leased(now_us) || self.units < cost {
            return Take::Short;
        }
        if self.pace_us > 0 {
            let pace = self.pace_us;
            // A GCRA of the pace, with PACE_SLACK slots of slack.
            let slack = pace.saturating_mul(PACE_SLACK);
            if now_us.saturating_add(slack) < self.pace_next_us {
                return Take::Paced {
                    wait_us: self.pace_next_us - slack - now_us,
                };
            }
            self.pace_next_us = self
                .pace_next_us
                .max(now_us)
                .saturating_add(pace.saturating_mul(cost));
        }
        self.units -= cost;
        Take::Taken
    }

    /// Puts back `cost` units taken for a request that was denied by another rule, if the
    /// lease they came from is still live.
    pub fn give_back(&mut self, cost: u64, now_us: u64) -> bool {
        if self.leased(now_us) {
            self.units = self.units.saturating_add(cost);
            true
        } else {
            false
        }
    }

    /// The units worth holding: two horizons of the key's local traffic, within `max_units`.
    pub fn target(&self, config: &LeaseConfig) -> u64 {
        self.expected()
            .saturating_mul(2)
            .min(config.terms.max_units)
    }

    /// How many units to ask for at `now_us`, if it is time to ask: when the key is busy
    /// enough to lease (at least two units a horizon), no ask is in flight, and the allowance
    /// holds less than half its [`target`](Allowance::target) (one horizon, when `max_units`
    /// allows two); then up to the target.
    pub fn want(&self, now_us: u64, config: &LeaseConfig) -> Option<u64> {
        let held = self.held(now_us);
        let target = self.target(config);
        let ttl = config.terms.ttl.as_micros().unsigned_abs();
        if self.expected() < LEASED_FROM_UNITS_A_HORIZON
            || held.saturating_mul(2) >= target
            || self.is_asking(now_us, ttl)
            || now_us < self.next_ask_us
        {
            return None;
        }
        Some(target - held)
    }

    /// Applies the server's answer to an ask sent at `asked_at_us`:
    /// `grant.granted` more units, the lease (all of the holder's units for this key) now
    /// ending `grant.lease_ms` after the ask left, and no more to ask for before
    /// `grant.more_in_ms`.
    ///
    /// While the holders' demands add up to more than the limit's rate, every answer comes
    /// with this holder's pace (see [`Allowance::take`]).
    ///
    /// The new lease covers only the units the server counts: not those whose lease had
    /// ended when the ask left (the ask said none were held), nor more than the server says
    /// it kept of those the ask said were held (a renewal that reached it after their lease
    /// ended there). Brought back to life, they would be spent outside every cap.
    pub fn grant(&mut self, asked_at_us: u64, grant: &LeaseGrant) {
        if !self.leased(asked_at_us) {
            self.units = 0;
        }
        if let Some(kept) = grant.kept {
            self.units = self.units.min(kept);
        }
        let granted = grant.granted;
        self.units = self.units.saturating_add(granted);
        // The server counts the lease from when it decided, after the ask left: ending it
        // here no later than there, no unit is spent after the server stopped counting it.
        self.lease_until_us = asked_at_us.saturating_add(grant.lease_ms.saturating_mul(1000));
        if grant.more_in_ms > 0 {
            self.next_ask_us = asked_at_us.saturating_add(grant.more_in_ms.saturating_mul(1000));
        }
        self.pace_us = grant.pace_us;
        self.asking_since_us = 0;
        self.limit = grant.limit;
        self.remaining = grant.remaining;
    }

    /// Takes every unit out, to give them back to the server.
    pub fn take_all(&mut self) -> u64 {
        std::mem::take(&mut self.units)
    }

    /// What to do at `now_us` with an allowance whose lease ends within `margin_us`: renew
    /// it while the key is in use (a request in the last half of the lease), give its units
    /// back when the key has gone quiet. `None` while the lease has longer to run, an ask is
    /// in flight, or nothing is held.
    pub fn lease_ending(&self, now_us: u64, ttl_us: u64, margin_us: u64) -> Option<Ending> {
        if self.units == 0
            || self.asking_since_us != 0
            || self.lease_until_us > now_us.saturating_add(margin_us)
        {
            return None;
        }
        if now_us.saturating_sub(self.last_seen_us) < ttl_us / 2 {
            Some(Ending::Renew)
        } else {
            Some(Ending::GiveBack)
        }
    }
}

/// What a lease about to end needs ([`Allowance::lease_ending`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The key is in use: keep the units, and tell the server so it keeps counting them.
    Renew,
    /// The key has gone quiet: give the units back, for any Envoy's next grant.
    GiveBack,
}

#[cfg(test)]
mod tests;
