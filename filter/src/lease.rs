//! Leases in the filter: each rule and key's [`Allowance`] in shared data, spent by every
//! worker with compare-and-swap; asks sent from the root context's tick; answers applied.
//!
//! A request's stream takes units out of the allowance when it can ([`Leases::take`]), with a
//! few more for the worker's [`Purse`], from which the next requests take theirs with no host
//! call; when the allowance runs low, it marks it as asked for (in the same compare-and-swap,
//! so one worker asks at a time). The root context's tick then sends one `POST /v1/lease` with every
//! ask this worker marked, renews the leases about to end of keys still in use, and gives back
//! the units of those that went quiet. Asks go out from the root context, not from a stream, because the
//! SDK drops the answer to a callout whose stream has ended, and a stream decided from a lease
//! ends long before the answer comes.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use sluice_core::deny_cache::{SlotKeys, entry_id};
use sluice_core::key::{LimitKey, RuleName};
use sluice_core::lease::{Allowance, Ending, LEASE_SLOTS, LeaseConfig, Purse, Take};
use sluice_core::policy::Rule;
use sluice_core::wire::{LeaseAsk, LeaseGrant, LeaseRequest, MAX_ASKS};

use crate::cas;
use crate::ticker::Ticker;

/// How often a write is retried after another worker changed the slot under it.
const CAS_ATTEMPTS: usize = 8;
/// How soon the tick sends an ask a request marked: requests meanwhile go to the server.
const ASK_TICK: Duration = Duration::from_millis(5);

/// Units taken from an allowance for one request, to give back if the request is denied.
#[derive(Debug)]
pub struct Reservation {
    slot: String,
    id: String,
    cost: u64,
    /// The lease of the purse the units came from; `None`: from the shared allowance.
    purse_lease_until_us: Option<u64>,
}

/// What an allowance says about one request.
pub enum Local {
    /// The units were taken: admitted; what the server said at the last grant.
    Taken {
        /// To give back if another rule denies the request.
        reservation: Reservation,
        /// The limit's capacity.
        limit: u64,
        /// What the server had left at the last grant.
        remaining: u64,
    },
    /// Denied here: the server has nothing to lease for the key for a while, or the key is
    /// contended and its units are spent at the pace they arrive.
    Denied {
        /// Milliseconds until a request could pass.
        retry_after_ms: u64,
        /// The limit's capacity.
        limit: u64,
    },
    /// No units here: decide it per request.
    NotHeld,
}

/// An ask on its way, to apply its answer.
struct Sent {
    /// The allowance's slot; empty for units given back that have none.
    slot: String,
    id: String,
    rule: usize,
    name: RuleName,
    key: LimitKey,
    asked_at_us: u64,
    returning: u64,
    lease_until_us: u64,
}

impl Sent {
    /// The units it gave back, to give back again (while their lease lasts).
    fn orphan(&self) -> Orphan {
        Orphan {
            rule: self.rule,
            name: self.name.clone(),
            key: self.key.clone(),
            units: self.returning,
            lease_until_us: self.lease_until_us,
        }
    }
}

/// The asks of one lease callout, kept by the root context until its answer.
pub struct SentAsks(Vec<Sent>);

/// What the tick makes of one allowance: an ask to send (want, held, returning, demand, the
/// lease's end), or nothing, with the allowance as it now stands (`None`: the slot went to
/// another key).
enum TickStep {
    Ask((u64, u64, u64, u64, u64)),
    Idle(Option<Allowance>),
}

/// A worker's record of an allowance it has used.
struct Touched {
    rule: usize,
    name: RuleName,
    key: LimitKey,
    id: String,
    /// When the tick must next look at it (its lease about to end, or long unused): until
    /// then the tick leaves its slot alone, unless it was asked for.
    look_at_us: u64,
}

/// Units granted or given back that have no allowance to go to: given back at the next tick.
struct Orphan {
    rule: usize,
    name: RuleName,
    key: LimitKey,
    units: u64,
    lease_until_us: u64,
}

#[derive(Default)]
struct WorkerState {
    /// By slot key: the allowances this worker used, which its tick looks after.
    touched: BTreeMap<String, Touched>,
    /// Slot keys this worker marked as asked for, with the mark's time, to ask at the next
    /// tick if the mark is still the one in force.
    wanted: Vec<(String, u64)>,
    /// By callout token.
    in_flight: HashMap<u32, Vec<Sent>>,
    orphans: Vec<Orphan>,
    /// By allowance id: this worker's purses.
    purses: HashMap<String, Pursed>,
}

/// A worker's purse and where its units came from.
struct Pursed {
    /// The allowance's slot.
    slot: String,
    /// The rule's index.
    rule: usize,
    purse: Purse,
}

/// The leases of one configuration, seen from one worker's VM.
pub struct Leases {
    /// The lease slots' keys, under the configuration's fingerprint.
    slot_keys: SlotKeys,
    holder: String,
    /// The shortest tick any leased rule wants; `None` when no rule leases.
    tick: Option<Duration>,
    ticker: Rc<Ticker>,
    state: RefCell<WorkerState>,
}

/// Reads allowance slot `key` and writes what `f` makes of it (see [`cas::update`]).
fn update<R>(key: &str, f: impl FnMut(Option<Allowance>) -> (Option<Allowance>, R)) -> Option<R> {
    cas::update(key, CAS_ATTEMPTS, Allowance::decode, Allowance::encode, f)
}

impl Leases {
    /// Leases for the rules of a configuration with `fingerprint`, held by `holder`.
    pub fn new(fingerprint: String, holder: String, rules: &[Rule], ticker: Rc<Ticker>) -> Leases {
        let tick = rules
            .iter()
            .filter_map(|r| r.lease.as_ref().map(LeaseConfig::tick_ms))
            .min()
            .map(Duration::from_millis);
        Leases {
            slot_keys: SlotKeys::new(&format!("{fingerprint}.lease"), LEASE_SLOTS),
            holder,
            tick,
            ticker,
            state: RefCell::default(),
        }
    }

    fn slot(&self, id: &str) -> String {
        self.slot_keys.key(id)
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

    /// Tries to decide `rule`'s request for `key` (costing `cost`) from its allowance at
    /// `now_us`, counting it towards the key's rate, and marks the allowance as asked for
    /// when it runs low.
    pub fn take(
        &self,
        rule_index: usize,
        rule: &Rule,
        config: &LeaseConfig,
        key: &LimitKey,
        now_us: u64,
    ) -> Local {
        let id = entry_id(&rule.name, key);
        let cost = rule.cost;
        let mut state = self.state.borrow_mut();
        if let Some(Pursed { slot, purse, .. }) = state.purses.get_mut(&id)
            && purse.take(cost, now_us)
        {
            return Local::Taken {
                reservation: Reservation {
                    slot: slot.clone(),
                    id,
                    cost,
                    purse_lease_until_us: Some(purse.lease_until_us),
                },
                limit: purse.limit,
                remaining: purse.remaining,
            };
        }
        let emptied = state.purses.remove(&id).map(|p| p.purse);
        drop(state);
        let slot = self.slot(&id);
        let ttl = config.terms.ttl.as_micros().unsigned_abs();
        let mut asked = false;
        let mut look_at_us = 0;
        let mut filled = None;
        let mut written = false;
        let local = update(&slot, |current| {
            asked = false;
            filled = None;
            let mut a = match current {
                Some(a) if a.id == id => a,
                Some(a) if !a.is_free(now_us, ttl) => return (None, Local::NotHeld),
                _ => Allowance::new(&id),
            };
            if let Some(purse) = &emptied {
                a.absorb(purse, now_us, config.horizon);
            }
            a.observe(cost, now_us, config.horizon);
            let limit = a.limit.max(rule.limit.capacity());
            let denied = |wait_us: u64| Local::Denied {
                retry_after_ms: wait_us.div_ceil(1000),
                limit,
            };
            // Units held are spent first: an empty answer only says there are no more.
            let local = match a.take(cost, now_us) {
                Take::Taken => {
                    filled = Some(a.fill(now_us));
                    Local::Taken {
                        reservation: Reservation {
                            slot: slot.clone(),
                            id: id.clone(),
                            cost,
                            purse_lease_until_us: None,
                        },
                        limit,
                        remaining: a.remaining,
                    }
                }
                Take::Paced { wait_us } => denied(wait_us),
                Take::Short if now_us < a.next_ask_us => denied(a.next_ask_us - now_us),
                Take::Short => Local::NotHeld,
            };
            if a.want(now_us, config).is_some() {
                a.asking_since_us = now_us;
                asked = true;
            }
            look_at_us = self.look_at(&a, ttl, now_us);
            written = true;
            (Some(a), local)
        });
        let mut state = self.state.borrow_mut();
        if asked {
            state.wanted.push((slot.clone(), now_us));
        }
        // Unless the allowance took it back, the emptied purse's units (fewer than a request
        // costs) are still this worker's to spend.
        let purse = if written { filled } else { emptied };
        if let Some(purse) = purse.filter(|p| p.units > 0) {
            let pursed = Pursed {
                slot: slot.clone(),
                rule: rule_index,
                purse,
            };
            state.purses.insert(id.clone(), pursed);
        }
        if local.is_some() {
            state
                .touched
                .entry(slot)
                .and_modify(|t| t.look_at_us = look_at_us)
                .or_insert_with(|| Touched {
                    rule: rule_index,
                    name: rule.name.clone(),
                    key: key.clone(),
                    id,
                    look_at_us,
                });
        }
        let period = if state.wanted.is_empty() {
            self.tick
        } else {
            Some(ASK_TICK)
        };
        drop(state);
        self.ticker.set_leasing(period);
        local.unwrap_or(Local::NotHeld)
    }

    /// Puts back units taken for a request that another rule denied.
    pub fn give_back(&self, reservation: &Reservation, now_us: u64) {
        if let Some(lease_until_us) = reservation.purse_lease_until_us {
            // Into the purse they came from, under the same lease, or they are lost.
            if let Some(pursed) = self.state.borrow_mut().purses.get_mut(&reservation.id) {
                pursed
                    .purse
                    .give_back(reservation.cost, lease_until_us, now_us);
            }
            return;
        }
        update(&reservation.slot, |current| match current {
            Some(mut a) if a.id == reservation.id => {
                // Only while the lease lives: after it, the units are no longer the holder's
                // to spend, and the unit is lost, which only costs an admission.
                let given = a.give_back(reservation.cost, now_us);
                (given.then_some(a), ())
            }
            _ => (None, ()),
        });
    }

    /// What the tick sends at `now_us`: the asks this worker marked, the units it gives back
    /// (idle allowances, leases about to end, orphans), as one lease request; `None` when
    /// there is nothing to say. Stops the tick when nothing needs it any more.
    pub fn on_tick(&self, rules: &[Rule], now_us: u64) -> Option<(LeaseRequest, SentAsks)> {
        self.return_purses(rules, now_us);
        let mut state = self.state.borrow_mut();
        let wanted = std::mem::take(&mut state.wanted);
        let mut asks: Vec<LeaseAsk> = Vec::new();
        let mut sent: Vec<Sent> = Vec::new();
        let margin = self.margin_us();
        // The asks requests marked first, then the leases due a look: a call carries at most
        // MAX_ASKS, and a marked ask left out is sent at the next tick, not forgotten (its
        // key would go to the server request by request until the mark ran out, a ttl later).
        let mut slots: Vec<String> = Vec::new();
        for (slot, _) in &wanted {
            if state.touched.contains_key(slot) && !slots.contains(slot) {
                slots.push(slot.clone());
            }
        }
        slots.extend(
            state
                .touched
                .iter()
                .filter(|(slot, t)| {
                    t.look_at_us <= now_us && !wanted.iter().any(|(w, _)| w == *slot)
                })
                .map(|(slot, _)| slot.clone()),
        );
        let mut looked_at = 0;
        for slot in &slots {
            if asks.len() >= MAX_ASKS {
                break;
            }
            looked_at += 1;
            let slot = slot.clone();
            let Some(touched) = state.touched.get(&slot) else {
                continue;
            };
            let Some(rule) = rules.get(touched.rule) else {
                continue;
            };
            let Some(config) = rule.lease.as_ref() else {
                continue;
            };
            let ttl = config.terms.ttl.as_micros().unsigned_abs();
            let id = touched.id.clone();
            let outcome = update(&slot, |current| {
                let Some(mut a) = current.filter(|a| a.id == id) else {
                    return (None, TickStep::Idle(None));
                };
                let held = a.held(now_us);
                let demand = a.demand_per_second(config.horizon);
                let until = a.lease_until_us;
                // Only the mark in force is asked for, if this worker made it: a mark that
                // waited a whole ttl counts as lost, and another worker may have marked since.
                if wanted
                    .iter()
                    .any(|(w, at)| *w == slot && *at == a.asking_since_us)
                {
                    let want = a.target(config).saturating_sub(held);
                    return (None, TickStep::Ask((want, held, 0, demand, until)));
                }
                match a.lease_ending(now_us, ttl, margin) {
                    Some(Ending::Renew) => {
                        let want = a.target(config).saturating_sub(held);
                        a.asking_since_us = now_us;
                        (Some(a), TickStep::Ask((want, held, 0, demand, until)))
                    }
                    Some(Ending::GiveBack) => {
                        let returning = if a.leased(now_us) { a.take_all() } else { 0 };
                        a.units = 0;
                        if returning == 0 {
                            return (Some(a.clone()), TickStep::Idle(Some(a)));
                        }
                        a.asking_since_us = now_us;
                        (Some(a), TickStep::Ask((0, 0, returning, 0, until)))
                    }
                    None => (None, TickStep::Idle(Some(a))),
                }
            });
            match outcome {
                Some(TickStep::Ask((want, held, returning, demand, lease_until_us))) => {
                    let touched = &state.touched[&slot];
                    asks.push(LeaseAsk {
                        rule: touched.name.clone(),
                        key: touched.key.clone(),
                        limit: rule.limit,
                        terms: config.terms,
                        want,
                        held,
                        returning,
                        demand,
                    });
                    sent.push(Sent {
                        slot: slot.clone(),
                        id: touched.id.clone(),
                        rule: touched.rule,
                        name: touched.name.clone(),
                        key: touched.key.clone(),
                        asked_at_us: now_us,
                        returning,
                        lease_until_us,
                    });
                }
                Some(TickStep::Idle(current)) => {
                    // Forget allowances that went to another key or stayed idle a whole ttl;
                    // look at the others again when they next need it.
                    let current = current.filter(|a| now_us.saturating_sub(a.last_seen_us) < ttl);
                    match current {
                        Some(a) => {
                            let look_at = self.look_at(&a, ttl, now_us).max(now_us + margin / 2);
                            if let Some(t) = state.touched.get_mut(&slot) {
                                t.look_at_us = look_at;
                            }
                        }
                        None => {
                            state.touched.remove(&slot);
                        }
                    }
                }
                // Every attempt lost the race to other workers: the next tick looks again.
                None => {}
            }
        }
        let orphans = std::mem::take(&mut state.orphans);
        for orphan in orphans {
            // Units the server no longer counts (their lease ended) are simply gone.
            if orphan.lease_until_us <= now_us || asks.len() >= MAX_ASKS {
                if orphan.lease_until_us > now_us {
                    state.orphans.push(orphan);
                }
                continue;
            }
            let Some(rule) = rules.get(orphan.rule) else {
                continue;
            };
            let Some(config) = rule.lease.as_ref() else {
                continue;
            };
            if asks
                .iter()
                .any(|a| a.rule == orphan.name && a.key == orphan.key)
            {
                state.orphans.push(orphan);
                continue;
            }
            let returning = orphan.units.min(config.terms.max_units);
            asks.push(LeaseAsk {
                rule: orphan.name.clone(),
                key: orphan.key.clone(),
                limit: rule.limit,
                terms: config.terms,
                want: 0,
                held: 0,
                returning,
                demand: 0,
            });
            sent.push(Sent {
                slot: String::new(),
                id: entry_id(&orphan.name, &orphan.key),
                rule: orphan.rule,
                name: orphan.name,
                key: orphan.key,
                asked_at_us: now_us,
                returning,
                lease_until_us: orphan.lease_until_us,
            });
        }
        let left_out = &slots[looked_at..];
        state
            .wanted
            .extend(wanted.into_iter().filter(|(w, _)| left_out.contains(w)));
        let idle = state.touched.is_empty()
            && state.in_flight.is_empty()
            && state.orphans.is_empty()
            && state.purses.is_empty();
        let period = if !state.wanted.is_empty() {
            Some(ASK_TICK)
        } else if idle && asks.is_empty() {
            None
        } else {
            self.tick
        };
        drop(state);
        self.ticker.set_leasing(period);
        if asks.is_empty() {
            return None;
        }
        let request = LeaseRequest {
            holder: self.holder.clone(),
            asks,
        };
        Some((request, SentAsks(sent)))
    }

    /// Puts the purses unused for a tick, or whose lease is about to end, back in their
    /// allowances, so that the look the tick then takes knows what the key holds and when it
    /// was last used.
    fn return_purses(&self, rules: &[Rule], now_us: u64) {
        let idle_us = self.tick.map_or(0, |t| t.as_micros() as u64);
        let margin = self.margin_us();
        let mut state = self.state.borrow_mut();
        let due: Vec<String> = state
            .purses
            .iter()
            .filter(|(_, p)| p.purse.due_back(now_us, idle_us, margin))
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            let Some(pursed) = state.purses.remove(&id) else {
                continue;
            };
            let Some(config) = rules.get(pursed.rule).and_then(|r| r.lease.as_ref()) else {
                continue;
            };
            let returned = update(&pursed.slot, |current| match current {
                Some(mut a) if a.id == id => {
                    a.absorb(&pursed.purse, now_us, config.horizon);
                    (Some(a), ())
                }
                // The slot went to another key: the units are lost, as its own were.
                _ => (None, ()),
            });
            // Every attempt lost the race: the next tick tries again.
            if returned.is_none() && pursed.purse.lease_until_us > now_us {
                state.purses.insert(id, pursed);
            }
        }
    }

    /// Remembers the asks of a lease callout sent with `token`.
    pub fn sent(&self, token: u32, sent: SentAsks) {
        self.state.borrow_mut().in_flight.insert(token, sent.0);
    }

    /// The asks of a lease callout that could not even be sent: asked again at the next tick.
    pub fn not_sent(&self, sent: SentAsks) {
        self.failed_asks(sent.0);
    }

    /// Applies the answer to the lease callout `token`; `Err` when it brought no usable
    /// answer. Calls `count` with each ask's rule and grant.
    pub fn answered(
        &self,
        token: u32,
        answer: Result<Vec<LeaseGrant>, String>,
        mut count: impl FnMut(usize, Option<&LeaseGrant>),
    ) {
        let Some(sent) = self.state.borrow_mut().in_flight.remove(&token) else {
            return;
        };
        let grants = match answer {
            Ok(grants) if grants.len() == sent.len() => grants,
            _ => {
                for s in &sent {
                    count(s.rule, None);
                }
                self.failed_asks(sent);
                return;
            }
        };
        for (s, grant) in sent.iter().zip(&grants) {
            count(s.rule, Some(grant));
            let mut look_at = None;
            let applied = !s.slot.is_empty()
                && update(&s.slot, |current| match current {
                    Some(mut a) if a.id == s.id => {
                        a.grant(s.asked_at_us, grant);
                        look_at = Some(a.lease_until_us.saturating_sub(self.margin_us()));
                        (Some(a), true)
                    }
                    _ => (None, false),
                })
                .unwrap_or(false);
            if let (Some(look_at), Some(t)) =
                (look_at, self.state.borrow_mut().touched.get_mut(&s.slot))
            {
                t.look_at_us = look_at;
            }
            if !applied && grant.granted > 0 {
                // The slot went to another key meanwhile: give these back at the next tick.
                self.state.borrow_mut().orphans.push(Orphan {
                    units: grant.granted,
                    lease_until_us: s
                        .asked_at_us
                        .saturating_add(grant.lease_ms.saturating_mul(1000)),
                    ..s.orphan()
                });
            }
        }
    }

    /// Asks that got no answer: their allowances may ask again; units they gave back are
    /// given back again at the next tick, while their lease lasts.
    fn failed_asks(&self, sent: Vec<Sent>) {
        for s in sent {
            if !s.slot.is_empty() {
                update(&s.slot, |current| match current {
                    Some(mut a) if a.id == s.id => {
                        a.asking_since_us = 0;
                        (Some(a), ())
                    }
                    _ => (None, ()),
                });
            }
            if s.returning > 0 {
                self.state.borrow_mut().orphans.push(s.orphan());
            }
        }
    }
}
