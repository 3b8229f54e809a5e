//! The tick for leases: the asks requests marked, renewals of leases about to
//! end, units given back (idle allowances, orphans, purses), sent as one lease call; and the
//! answers to those calls applied to the allowances.

use sluice_core::deny_cache::entry_id;
use sluice_core::lease::{Allowance, Ending, LeaseConfig};
use sluice_core::policy::Rule;
use sluice_core::wire::{LeaseAsk, LeaseGrant, LeaseRequest, MAX_ASKS};

use crate::shared_data::SharedData;

use super::{LeaseTick, Leases, Orphan, Sent, WorkerState};

/// The grants of the answer `body` to lease call `request`, or why there are none.
pub fn grants(request: &LeaseRequest, body: &[u8]) -> Result<Vec<LeaseGrant>, String> {
    request
        .parse_response(body)
        .map(|r| r.grants)
        .map_err(|e| e.to_string())
}

/// The most marked slots a tick looks at (in the order marked; the others wait for the next
/// ticks), and the most slots due a look it looks at besides: a few calls' worth, for those
/// that turn out to have nothing to ask. Each one looked at costs lookups by slot name under the
/// module's lock: with 20,000 keys marked at once, looking at all of them took 7 to 14 ms a
/// tick.
pub(super) const SLOTS_A_TICK: usize = 4 * MAX_ASKS;

/// The asks of one lease callout, kept by the root context until its answer.
pub struct SentAsks(pub(super) Vec<Sent>);

/// What an ask says of one allowance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AskTerms {
    /// Units asked for.
    want: u64,
    /// Units the holder still holds under a live lease.
    held: u64,
    /// Units given back.
    returning: u64,
    /// The key's local demand, in units a second.
    demand: u64,
    /// When the lease in force ends.
    lease_until_us: u64,
}

/// What the tick makes of one allowance: an ask to send, or nothing, with the allowance as it
/// now stands (`None`: the slot went to another key).
enum TickStep {
    Ask(AskTerms),
    Idle(Option<Allowance>),
}

/// One lease call being put together.
#[derive(Default)]
struct Call {
    asks: Vec<LeaseAsk>,
    sent: Vec<Sent>,
}

impl Call {
    fn full(&self) -> bool {
        self.asks.len() >= MAX_ASKS
    }
}

/// Notes each mark in `wanted` on its allowance, if this worker touched it (a mark on
/// another is not asked for).
fn note_marks(state: &mut WorkerState, wanted: &[(String, u64)]) {
    let tick = state.ticks;
    for (place, (slot, at)) in wanted.iter().enumerate() {
        if let Some(touched) = state.touched.get_mut(slot) {
            touched.marks.note(tick, place, *at);
        }
    }
}

/// The slots the tick looks at: those requests marked as asked for (in the order first
/// marked; see [`note_marks`]), then up to [`SLOTS_A_TICK`] of the leases due a look; and
/// whether more are due than that.
fn slots_to_look_at(
    state: &mut WorkerState,
    wanted: &[(String, u64)],
    now_us: u64,
) -> (Vec<String>, bool) {
    let tick = state.ticks;
    let first_marked = |place: usize, slot: &str| {
        state
            .touched
            .get(slot)
            .and_then(|t| t.marks.of(tick).first())
            .is_some_and(|(first, _)| *first == place)
    };
    let mut slots: Vec<String> = wanted
        .iter()
        .enumerate()
        .filter(|(place, (slot, _))| first_marked(*place, slot))
        .map(|(_, (slot, _))| slot.clone())
        .collect();
    let (due, more_due) = state.due(now_us, tick, SLOTS_A_TICK);
    slots.extend(due);
    (slots, more_due)
}

/// What the tick at `now_us` does with allowance `a`, whose slot this worker marked with
/// `marks`: ask for the mark in force if this worker made it (a mark that waited a whole ttl
/// counts as lost, and another worker may have marked since), renew a lease about to end on
/// a key in use, give back the units of one gone quiet. Returns the allowance to write, if
/// changed.
fn step(
    mut a: Allowance,
    config: &LeaseConfig,
    marks: &[(usize, u64)],
    margin_us: u64,
    now_us: u64,
) -> (Option<Allowance>, TickStep) {
    let ttl = config.terms.ttl.as_micros().unsigned_abs();
    let held = a.held(now_us);
    // Up to the target, for a mark in force or a lease renewed.
    let more = AskTerms {
        want: a.target(config).saturating_sub(held),
        held,
        returning: 0,
        demand: a.demand_per_second(config.horizon),
        lease_until_us: a.lease_until_us,
    };
    if marks.iter().any(|(_, at)| *at == a.asking_since_us) {
        return (None, TickStep::Ask(more));
    }
    match a.lease_ending(now_us, ttl, margin_us) {
        Some(Ending::Renew) => {
            a.asking_since_us = now_us;
            (Some(a), TickStep::Ask(more))
        }
        Some(Ending::GiveBack) => {
            let returning = if a.leased(now_us) { a.take_all() } else { 0 };
            a.units = 0;
            if returning == 0 {
                return (Some(a.clone()), TickStep::Idle(Some(a)));
            }
            a.asking_since_us = now_us;
            let back = AskTerms {
                want: 0,
                held: 0,
                returning,
                demand: 0,
                ..more
            };
            (Some(a), TickStep::Ask(back))
        }
        None => (None, TickStep::Idle(Some(a))),
    }
}

impl<D: SharedData, T: LeaseTick> Leases<D, T> {
    /// What the tick sends at `now_us`: the asks this worker marked, the units it gives back
    /// (idle allowances, leases about to end, orphans), as one lease request; `None` when
    /// there is nothing to say. Stops the tick when nothing needs it any more.
    pub fn on_tick(&self, rules: &[Rule], now_us: u64) -> Option<(LeaseRequest, SentAsks)> {
        self.return_purses(rules, now_us);
        let mut state = self.state.borrow_mut();
        let looked_for = state.wanted.len().min(SLOTS_A_TICK);
        let wanted: Vec<(String, u64)> = state.wanted.drain(..looked_for).collect();
        // A call carries at most MAX_ASKS, and a marked ask left out is sent at the next tick,
        // not forgotten (its key would go to the server request by request until the mark ran
        // out, a ttl later).
        state.ticks += 1;
        note_marks(&mut state, &wanted);
        let (slots, more_due) = slots_to_look_at(&mut state, &wanted, now_us);
        state.more_due = more_due;
        let mut call = Call::default();
        let mut looked_at = 0;
        for slot in &slots {
            if call.full() {
                break;
            }
            looked_at += 1;
            self.look(&mut state, rules, slot, now_us, &mut call);
        }
        self.ask_for_orphans(&mut state, rules, now_us, &mut call);
        // The marks of the slots the full call left out wait for the next tick, in the order
        // marked (those looked at took theirs).
        let tick = state.ticks;
        let mut kept = vec![false; wanted.len()];
        for slot in &slots[looked_at..] {
            if let Some(touched) = state.touched.get_mut(slot) {
                for (place, _) in touched.marks.take(tick) {
                    kept[place] = true;
                }
            }
        }
        let left_out = wanted
            .into_iter()
            .zip(kept)
            .filter_map(|(mark, kept)| kept.then_some(mark));
        for mark in left_out.rev() {
            state.wanted.push_front(mark);
        }
        // Those left out of a full call go at the next short tick, whatever they wait for.
        state.short_of_units = !state.wanted.is_empty();
        let idle = state.touched.is_empty()
            && state.in_flight.is_empty()
            && state.orphans.is_empty()
            && state.purses.iter().all(|purses| purses.is_empty());
        let period = if idle && state.wanted.is_empty() && call.asks.is_empty() {
            None
        } else {
            self.period(&state)
        };
        drop(state);
        self.ticker.set_leasing(period);
        if call.asks.is_empty() {
            return None;
        }
        let request = LeaseRequest {
            holder: self.holder.name.clone(),
            secret: self.holder.secret.clone(),
            asks: call.asks,
        };
        Some((request, SentAsks(call.sent)))
    }

    /// Looks at the allowance in `slot`: adds its ask to `call`, or notes when to look again
    /// (or forgets it: it went to another key, or stayed idle a whole ttl).
    fn look(
        &self,
        state: &mut WorkerState,
        rules: &[Rule],
        slot: &str,
        now_us: u64,
        call: &mut Call,
    ) {
        let Some(touched) = state.touched.get_mut(slot) else {
            return;
        };
        // Taken, looked at or not: a mark is asked for once.
        let marks = touched.marks.take(state.ticks);
        let touched = &*touched;
        let Some((rule, config)) = rules
            .get(touched.rule)
            .and_then(|r| Some((r, r.lease.as_ref()?)))
        else {
            return;
        };
        let ttl = config.terms.ttl.as_micros().unsigned_abs();
        let margin = self.margin_us();
        let id = touched.id.clone();
        let outcome = self.update(slot, |current| match current.filter(|a| a.id == id) {
            Some(a) => step(a, config, &marks, margin, now_us),
            None => (None, TickStep::Idle(None)),
        });
        match outcome {
            Some(TickStep::Ask(terms)) => {
                let touched = &state.touched[slot];
                call.asks.push(LeaseAsk {
                    rule: touched.name.clone(),
                    key: touched.key.clone(),
                    limit: rule.limit,
                    terms: config.terms,
                    want: terms.want,
                    held: terms.held,
                    returning: terms.returning,
                    demand: terms.demand,
                    share_span_ms: 0,
                    demand_per_ks: 0,
                    carry_per_k: 0,
                    max_holders: 0,
                });
                call.sent.push(Sent {
                    slot: slot.to_owned(),
                    id: touched.id.clone(),
                    rule: touched.rule,
                    name: touched.name.clone(),
                    key: touched.key.clone(),
                    asked_at_us: now_us,
                    returning: terms.returning,
                    lease_until_us: terms.lease_until_us,
                });
            }
            Some(TickStep::Idle(current)) => {
                match current.filter(|a| now_us.saturating_sub(a.last_seen_us) < ttl) {
                    Some(a) => {
                        let look_at = self.look_at(&a, ttl, now_us).max(now_us + margin / 2);
                        state.look_at(slot, look_at);
                    }
                    None if self.forget(slot, ttl, now_us) => {
                        state.touched.remove(slot);
                    }
                    // Not free yet (an ask out, or units under a lease): looked at again.
                    None => state.look_at(slot, now_us + margin.max(1)),
                }
            }
            // Every attempt lost the race to other workers: the next tick looks again.
            None => {}
        }
    }

    /// Gives back the units that have no allowance to go to, while their lease lasts (after
    /// it, the server no longer counts them: they are simply gone).
    fn ask_for_orphans(
        &self,
        state: &mut WorkerState,
        rules: &[Rule],
        now_us: u64,
        call: &mut Call,
    ) {
        for orphan in std::mem::take(&mut state.orphans) {
            if orphan.lease_until_us <= now_us {
                continue;
            }
            let Some((rule, config)) = rules
                .get(orphan.rule)
                .and_then(|r| Some((r, r.lease.as_ref()?)))
            else {
                continue;
            };
            let already_asked = call
                .asks
                .iter()
                .any(|a| a.rule == orphan.name && a.key == orphan.key);
            if call.full() || already_asked {
                state.orphans.push(orphan);
                continue;
            }
            let returning = orphan.units.min(config.terms.max_units);
            call.asks.push(LeaseAsk {
                rule: orphan.name.clone(),
                key: orphan.key.clone(),
                limit: rule.limit,
                terms: config.terms,
                want: 0,
                held: 0,
                returning,
                demand: 0,
                share_span_ms: 0,
                demand_per_ks: 0,
                carry_per_k: 0,
                max_holders: 0,
            });
            call.sent.push(Sent {
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
    }

    /// Puts the purses unused for a tick, or whose lease is about to end, back in their
    /// allowances, so that the look the tick then takes knows what the key holds and when it
    /// was last used.
    fn return_purses(&self, rules: &[Rule], now_us: u64) {
        let idle_us = self.tick.map_or(0, |t| t.as_micros() as u64);
        let margin = self.margin_us();
        let mut state = self.state.borrow_mut();
        let due: Vec<(usize, String)> = state
            .purses
            .iter()
            .enumerate()
            .flat_map(|(rule, purses)| {
                purses
                    .iter()
                    .filter(|(_, p)| p.purse.due_back(now_us, idle_us, margin))
                    .map(move |(key, _)| (rule, key.clone()))
            })
            .collect();
        for (rule, key) in due {
            let Some(pursed) = state.purses_of(rule).remove(&key) else {
                continue;
            };
            let Some(config) = rules.get(rule).and_then(|r| r.lease.as_ref()) else {
                continue;
            };
            let returned = self.update(&pursed.slot, |current| match current {
                Some(mut a) if a.id == pursed.id => {
                    a.absorb(&pursed.purse, now_us, config.horizon);
                    (Some(a), ())
                }
                // The slot went to another key: the units are lost, as its own were.
                _ => (None, ()),
            });
            // Every attempt lost the race: the next tick tries again.
            if returned.is_none() && pursed.purse.lease_until_us > now_us {
                state.purses_of(rule).insert(key, pursed);
            }
        }
    }

    /// Remembers the asks of a lease callout sent with `token`.
    pub fn sent(&self, token: u64, sent: SentAsks) {
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
        token: u64,
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
                && self
                    .update(&s.slot, |current| match current {
                        Some(mut a) if a.id == s.id => {
                            a.grant(s.asked_at_us, grant);
                            look_at = Some(a.lease_until_us.saturating_sub(self.margin_us()));
                            (Some(a), true)
                        }
                        _ => (None, false),
                    })
                    .unwrap_or(false);
            if let Some(look_at) = look_at {
                self.state.borrow_mut().look_at(&s.slot, look_at);
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
                self.update(&s.slot, |current| match current {
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
