//! Leases in a filter: each rule and key's [`Allowance`] in shared data, spent by every
//! worker with compare-and-swap; asks sent from the filter's tick; answers applied.
//!
//! A request's stream takes units out of the allowance when it can ([`Leases::take`]), with a
//! few more for the worker's [`Purse`], from which the next requests take theirs with no host
//! call; when the allowance runs low, it marks it as asked for (in the same compare-and-swap,
//! so one worker asks at a time). The root context's tick then sends one `POST /v1/lease` with every
//! ask this worker marked, renews the leases about to end of keys still in use, and gives back
//! the units of those that went quiet. Asks go out from the root context, not from a stream, because the
//! SDK drops the answer to a callout whose stream has ended, and a stream decided from a lease
//! ends long before the answer comes. (The native module ticks and calls from its configuration
//! on Envoy's main thread, for the same reason.)

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::deny_cache::{SlotKeys, entry_id};
use sluice_core::key::LimitKey;
use sluice_core::lease::{Allowance, LEASE_SLOTS, LeaseConfig, PURSE_UNITS, Purse, Take};
use sluice_core::policy::Rule;
use sluice_core::wire::MAX_ASKS;

use crate::Local;
use crate::cas;
use crate::shared_data::SharedData;

mod state;
#[cfg(test)]
mod tests;
mod tick;

pub(crate) use state::PurseHasher;
use state::{Orphan, Pursed, Sent, Touched, WorkerState};
pub use tick::{SentAsks, grants};

/// How often a write is retried after another worker changed the slot under it.
const CAS_ATTEMPTS: usize = 8;
/// How soon, by default, the tick sends an ask a request marked: requests meanwhile go to the
/// server.
const ASK_TICK: Duration = Duration::from_millis(5);
/// How long an urgent ask waits to go out with others where one tick serves every worker of a
/// process (see [`Leases::process_wide`]): one for a key with no units left, whose requests are
/// decided per request meanwhile. On many keys each asks about twice a second: at the .wasm's
/// 5 ms, 1,000 keys at 9,000 requests a second took 15 lease calls per 1,000 requests (`make
/// bench`). The other asks wait for the next tick or a call's worth of them
/// ([`Leases::patient_asks`]): at 20 ms for all, 1,000 keys at 6,900 requests a second took
/// 53 lease calls a second, 31 asks each.
const PROCESS_ASK_TICK: Duration = Duration::from_millis(20);
/// The most units the purse of a key takes from its allowance at once where one purse serves
/// every worker of a process (a quarter of what the allowance holds, at most this), where the
/// .wasm keeps one a worker of [`PURSE_UNITS`]: a take from the allowance decodes and encodes
/// its record, about 2,000 instructions, so the fewer the better; on a hot key with a small
/// grant the quarter binds first (docs/performance-log.md). Its units are the holder's,
/// granted, as before: the bound is the same.
const PROCESS_PURSE_UNITS: u64 = 64;

/// Units taken from an allowance for one request, to give back if the request is denied.
#[derive(Debug)]
pub struct Reservation {
    cost: u64,
    taken_from: TakenFrom,
}

/// Where a reservation's units came from.
#[derive(Debug)]
enum TakenFrom {
    /// The shared allowance in `slot`, the key's while its id is `id`.
    Allowance { slot: String, id: String },
    /// The purse of the rule and key they were taken for (as nearly every request on a busy
    /// key is: a take from it allocates nothing), under the lease that ends at
    /// `lease_until_us`.
    Purse { lease_until_us: u64 },
}

/// What one take's compare-and-swap did, whichever attempt won.
#[derive(Default)]
struct TakeStep {
    /// It marked the allowance as asked for.
    asked: bool,
    /// It wrote the allowance (else another key holds the slot, or every attempt lost).
    written: bool,
    /// The purse it filled.
    filled: Option<Purse>,
    /// When the tick must next look at the allowance.
    look_at_us: u64,
    /// The allowance held too few units for the request.
    short: bool,
}

/// Who this Envoy is in the lease ledgers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its name, the same in every worker.
    pub name: String,
    /// The secret that binds the name (see [`sluice_core::wire::LeaseRequest::secret`]).
    pub secret: String,
}

/// What runs the leases' tick: told how often the leases want it (`None`: not at all), it
/// calls [`Leases::on_tick`] at about that period, and sooner after a shorter one is asked.
pub trait LeaseTick {
    /// Sets the period the leases want.
    fn set_leasing(&self, period: Option<Duration>);
}

impl<T: LeaseTick + ?Sized> LeaseTick for Rc<T> {
    fn set_leasing(&self, period: Option<Duration>) {
        (**self).set_leasing(period);
    }
}

impl<T: LeaseTick + ?Sized> LeaseTick for Arc<T> {
    fn set_leasing(&self, period: Option<Duration>) {
        (**self).set_leasing(period);
    }
}

/// The leases of one configuration, seen from one worker (a proxy-wasm VM), or from every
/// worker at once (the native module, which keeps them behind a lock).
pub struct Leases<D, T> {
    /// Where the allowances are, shared by every worker.
    data: D,
    /// The lease slots' keys, under the configuration's fingerprint.
    slot_keys: SlotKeys,
    /// Whether each key has a slot of its own ([`Leases::slot_per_key`]), not one of
    /// [`LEASE_SLOTS`] by the hash of its id: Envoy's shared data keeps every key it was
    /// given, so there their number must be bounded.
    slot_per_key: bool,
    holder: Holder,
    /// The shortest tick any leased rule wants; `None` when no rule leases.
    tick: Option<Duration>,
    /// How soon the tick sends an ask a request marked.
    ask_tick: Duration,
    /// Whether asks wait for the next tick, unless a call's worth are waiting or a key
    /// waiting on its ask ran out (see [`Leases::patient_asks`]).
    patient: bool,
    /// The most units a purse takes from its allowance at once.
    purse_units: u64,
    ticker: T,
    state: RefCell<WorkerState>,
}

impl<D: SharedData, T: LeaseTick> Leases<D, T> {
    /// Leases for the rules of a configuration with `fingerprint`, held by `holder`, their
    /// allowances in `data`.
    pub fn new(
        data: D,
        fingerprint: String,
        holder: Holder,
        rules: &[Rule],
        ticker: T,
    ) -> Leases<D, T> {
        let tick = rules
            .iter()
            .filter_map(|r| r.lease.as_ref().map(LeaseConfig::tick_ms))
            .min()
            .map(Duration::from_millis);
        Leases {
            data,
            slot_keys: SlotKeys::new(&format!("{fingerprint}.lease"), LEASE_SLOTS),
            slot_per_key: false,
            holder,
            tick,
            ask_tick: ASK_TICK,
            patient: false,
            purse_units: PURSE_UNITS,
            ticker,
            state: RefCell::default(),
        }
    }

    /// Sends the asks requests mark `ask_tick` after the first of them, not [`ASK_TICK`]:
    /// longer gathers more keys' asks in each call.
    pub fn asking_after(self, ask_tick: Duration) -> Leases<D, T> {
        Leases { ask_tick, ..self }
    }

    /// Lets an ask wait for the next tick (at least `ask_tick`) rather than go `ask_tick`
    /// after it was marked, unless a call's worth of asks are waiting or a key whose ask
    /// waits has run out of units. An ask is marked while its key still holds a horizon of
    /// units, and a tick is at most a quarter of the horizon, so the wait costs no request a
    /// callout; on many keys the calls go out fuller, and fewer.
    pub fn patient_asks(self) -> Leases<D, T> {
        Leases {
            patient: true,
            ..self
        }
    }

    /// Purses take up to `units` from their allowance at once, not [`PURSE_UNITS`]: where
    /// one purse serves every worker of a process (the native module), fewer takes from the
    /// allowance, each a decode and an encode of its record.
    pub fn purses_up_to(self, units: u64) -> Leases<D, T> {
        Leases {
            purse_units: units,
            ..self
        }
    }

    /// Reads allowance slot `key` and writes what `f` makes of it (see [`cas::update`]).
    fn update<R>(
        &self,
        key: &str,
        f: impl FnMut(Option<Allowance>) -> (Option<Allowance>, R),
    ) -> Option<R> {
        cas::update(
            &self.data,
            key,
            CAS_ATTEMPTS,
            Allowance::decode,
            Allowance::encode,
            f,
        )
    }

    /// Gives each key a slot of its own, named by its id, and removes the slot when the
    /// tick forgets the key (idle for a ttl): where the shared data can remove a key (the
    /// module's process memory), so that keys need not share [`LEASE_SLOTS`] slots, where a
    /// key whose slot another busy key holds is decided per request.
    pub fn slot_per_key(self) -> Leases<D, T> {
        Leases {
            slot_per_key: true,
            ..self
        }
    }

    /// The settings of leases whose store, tick and purses one process's workers share (the
    /// native module): asks sent [`PROCESS_ASK_TICK`] after an urgent one and otherwise at
    /// the tick, a slot per key, purses of up to [`PROCESS_PURSE_UNITS`].
    pub fn process_wide(self) -> Leases<D, T> {
        self.asking_after(PROCESS_ASK_TICK)
            .patient_asks()
            .slot_per_key()
            .purses_up_to(PROCESS_PURSE_UNITS)
    }

    fn slot(&self, id: &str) -> String {
        if self.slot_per_key {
            self.slot_keys.own_key(id)
        } else {
            self.slot_keys.key(id)
        }
    }

    /// Whether the tick may forget the allowance in `slot`, idle for a ttl: always where
    /// slots are shared (the next key to use it takes it over); where each key has its own,
    /// once it is removed, free (see [`Allowance::is_free`]), so that no unit, ask or pace
    /// is forgotten with it.
    fn forget(&self, slot: &str, ttl_us: u64, now_us: u64) -> bool {
        if !self.slot_per_key {
            return true;
        }
        match self.data.read(slot) {
            None => true,
            Some((bytes, cas)) => match Allowance::decode(&bytes) {
                Some(a) if !a.is_free(now_us, ttl_us) => false,
                _ => self.data.remove(slot, cas),
            },
        }
    }

    /// The period the tick wants for `state`, while anything needs it: the rules' tick, or,
    /// while asks wait (see [`Leases::patient_asks`]) or more leases are due a look than the
    /// last tick looked at, the short `ask_tick`.
    fn period(&self, state: &WorkerState) -> Option<Duration> {
        if state.wanted.is_empty() && !state.more_due {
            return self.tick;
        }
        let hurry = !self.patient
            || state.short_of_units
            || state.more_due
            || state.wanted.len() >= MAX_ASKS;
        match self.tick {
            Some(tick) if !hurry => Some(tick.max(self.ask_tick)),
            _ => Some(self.ask_tick),
        }
    }

    /// How long before a lease ends the tick renews it or gives its units back: two ticks.
    fn margin_us(&self) -> u64 {
        self.tick.map_or(0, |t| 2 * t.as_micros() as u64)
    }

    /// When the tick must next look at allowance `a`: as its lease is about to end (while it
    /// holds units), or once it has been unused for a whole `ttl_us` (to forget it).
    fn look_at(&self, a: &Allowance, ttl_us: u64, now_us: u64) -> u64 {
        let unused = a.last_seen_us.saturating_add(ttl_us);
        if a.units > 0 && a.leased(now_us) {
            a.lease_until_us
                .saturating_sub(self.margin_us())
                .min(unused)
        } else {
            unused
        }
    }

    /// Tries to decide `rule`'s request for `key` (costing `cost`) from the worker's purse or
    /// the allowance at `now_us`, counting it towards the key's rate, and marks the allowance
    /// as asked for when it runs low.
    pub fn take(
        &self,
        rule_index: usize,
        rule: &Rule,
        config: &LeaseConfig,
        key: &LimitKey,
        now_us: u64,
    ) -> Local<Reservation> {
        if let Some(local) = self.take_from_purse(rule_index, key, rule.cost, now_us) {
            return local;
        }
        // A key's purse (it holds fewer units than a request costs) is emptied into the
        // allowance and refilled from it: its key, id and slot serve again, with no
        // allocation. A key's first take makes them.
        let taken = self.state.borrow_mut().take_purse(rule_index, key);
        let (place, emptied, id, slot) = match taken {
            Some((place, Pursed { id, slot, purse })) => (Some(place), Some(purse), id, slot),
            None => {
                let id = entry_id(&rule.name, key);
                let slot = self.slot(&id);
                (None, None, id, slot)
            }
        };
        let ttl = config.terms.ttl.as_micros().unsigned_abs();
        let mut step = TakeStep::default();
        let local = self.update(&slot, |current| {
            step = TakeStep::default();
            let mut a = match current {
                Some(a) if a.id == id => a,
                Some(a) if !a.is_free(now_us, ttl) => return (None, Local::NotHeld),
                _ => Allowance::new(&id),
            };
            if let Some(purse) = &emptied {
                a.absorb(purse, now_us, config.horizon);
            }
            a.observe(rule.cost, now_us, config.horizon);
            let limit = a.limit.max(rule.limit.capacity());
            let denied = |wait_us: u64| Local::Denied {
                retry_after_ms: wait_us.div_ceil(1000),
                limit,
            };
            // Units held are spent first: an empty answer only says there are no more.
            let local = match a.take(rule.cost, now_us) {
                Take::Taken => {
                    step.filled = Some(a.fill(now_us, self.purse_units));
                    Local::Taken {
                        reservation: (),
                        limit,
                        remaining: a.remaining,
                    }
                }
                Take::Paced { wait_us } => denied(wait_us),
                Take::Short if now_us < a.next_ask_us => denied(a.next_ask_us - now_us),
                Take::Short => {
                    step.short = true;
                    Local::NotHeld
                }
            };
            if a.want(now_us, config).is_some() {
                a.asking_since_us = now_us;
                step.asked = true;
            }
            step.look_at_us = self.look_at(&a, ttl, now_us);
            step.written = true;
            (Some(a), local)
        });
        // The last attempt wrote only if the update says so: every attempt may have lost, and
        // a purse filled by a write that never happened holds units still in the allowance.
        let written = step.written && local.is_some();
        // Unless the allowance took it back, the emptied purse's units (fewer than a request
        // costs) are still this worker's to spend.
        let purse = if written { step.filled } else { emptied }.filter(|p| p.units > 0);
        let local = local.map(|local| {
            local.map_reservation(|()| Reservation {
                cost: rule.cost,
                // A unit taken along with a purse's goes back into that purse if the request
                // is denied: the same holder's, under the same lease.
                taken_from: match &purse {
                    Some(p) if written => TakenFrom::Purse {
                        lease_until_us: p.lease_until_us,
                    },
                    _ => TakenFrom::Allowance {
                        slot: slot.clone(),
                        id: id.clone(),
                    },
                },
            })
        });
        let mut state = self.state.borrow_mut();
        if written && step.asked {
            state.wanted.push_back((slot.clone(), now_us));
        }
        // Searched only where the flag can change the period: with a call's worth of asks
        // waiting the short tick is due anyway, and each tick sets the flag afresh. A search
        // on every take cost thousands of comparisons a take with thousands of keys waiting.
        if written
            && step.short
            && !state.short_of_units
            && (step.asked
                || (state.wanted.len() < MAX_ASKS && state.wanted.iter().any(|(w, _)| *w == slot)))
        {
            state.short_of_units = true;
        }
        if local.is_some() {
            state.touch(&slot, step.look_at_us, || {
                Touched::new(rule_index, rule.name.clone(), key.clone(), id.clone())
            });
        }
        if let Some(purse) = purse {
            let place = place.unwrap_or_else(|| key.as_str().to_owned());
            state
                .purses_of(rule_index)
                .insert(place, Pursed { id, slot, purse });
        }
        let period = self.period(&state);
        drop(state);
        self.ticker.set_leasing(period);
        local.unwrap_or(Local::NotHeld)
    }

    /// Takes `cost` units from the worker's purse for rule `rule`'s `key`, if it holds them.
    fn take_from_purse(
        &self,
        rule: usize,
        key: &LimitKey,
        cost: u64,
        now_us: u64,
    ) -> Option<Local<Reservation>> {
        let mut state = self.state.borrow_mut();
        let Pursed { purse, .. } = state.purses.get_mut(rule)?.get_mut(key.as_str())?;
        if !purse.take(cost, now_us) {
            return None;
        }
        Some(Local::Taken {
            reservation: Reservation {
                cost,
                taken_from: TakenFrom::Purse {
                    lease_until_us: purse.lease_until_us,
                },
            },
            limit: purse.limit,
            remaining: purse.remaining,
        })
    }

    /// Puts back units taken for a request that another rule denied: for rule `rule`'s
    /// `key`.
    pub fn give_back(&self, reservation: &Reservation, rule: usize, key: &LimitKey, now_us: u64) {
        let (slot, id) = match &reservation.taken_from {
            TakenFrom::Purse { lease_until_us } => {
                // Into the purse they came from, under the same lease, or they are lost.
                let mut state = self.state.borrow_mut();
                if let Some(pursed) = state
                    .purses
                    .get_mut(rule)
                    .and_then(|purses| purses.get_mut(key.as_str()))
                {
                    pursed
                        .purse
                        .give_back(reservation.cost, *lease_until_us, now_us);
                }
                return;
            }
            TakenFrom::Allowance { slot, id } => (slot, id),
        };
        self.update(slot, |current| match current {
            Some(mut a) if a.id == *id => {
                // Only while the lease lives: after it, the units are no longer the holder's
                // to spend, and the unit is lost, which only costs an admission.
                let given = a.give_back(reservation.cost, now_us);
                (given.then_some(a), ())
            }
            _ => (None, ()),
        });
    }
}
