//! Leases over in-memory shared data with Envoy's CAS semantics: workers (one `Leases` each,
//! as each worker's VM has) spending one Envoy's allowances, racing, and the tick's asks,
//! give-backs and orphans. Times are microseconds; nothing reads a clock.

use std::borrow::Cow;
use std::cell::Cell;

use sluice_core::key::LimitKey;
use sluice_core::lease::{Allowance, PURSE_UNITS};
use sluice_core::policy::{HttpRequest, Policy};
use sluice_core::wire::{LeaseGrant, LeaseRequest};

use super::state::TickMarks;
use super::*;
use crate::shared_data::MemorySharedData;

mod slots;

const MS: u64 = 1000;

/// A tick the tests run by hand.
struct NoTick;

impl LeaseTick for NoTick {
    fn set_leasing(&self, _period: Option<Duration>) {}
}

/// One worker's leases.
type Worker = Leases<Rc<MemorySharedData>, NoTick>;

/// One Envoy: its shared data, its policy (one leased rule on `x-tenant`), and the key of
/// tenant `acme`.
struct Envoy {
    data: Rc<MemorySharedData>,
    policy: Policy,
    key: LimitKey,
}

impl Envoy {
    fn new() -> Envoy {
        let policy = Policy::from_json(
            br#"{"cluster": "sluice", "rules": [{"name": "per-tenant", "key": [{"header": "x-tenant"}],
                 "limit": {"algorithm": "gcra", "rate": 1000, "per": "1s", "burst": 1000},
                 "lease": {"horizon": "100ms"}}]}"#,
        )
        .unwrap();
        let request = HttpRequest {
            headers: [(Cow::Borrowed("x-tenant"), Cow::Borrowed(b"acme".as_slice()))]
                .into_iter()
                .collect(),
            source_address: None,
        };
        let key = policy.plan(&request).checks.remove(0).key;
        Envoy {
            data: Rc::new(MemorySharedData::default()),
            policy,
            key,
        }
    }

    /// A worker's view of the leases.
    fn worker(&self) -> Worker {
        self.worker_ticked_by(NoTick)
    }

    /// A worker's view of the leases, whose tick is `ticker`.
    fn worker_ticked_by<T: LeaseTick>(&self, ticker: T) -> Leases<Rc<MemorySharedData>, T> {
        Leases::new(
            Rc::clone(&self.data),
            "fp".to_owned(),
            Holder {
                name: "envoy:1".to_owned(),
                secret: "s".to_owned(),
            },
            &self.policy.rules,
            ticker,
        )
    }

    fn take<T: LeaseTick>(
        &self,
        worker: &Leases<Rc<MemorySharedData>, T>,
        now_us: u64,
    ) -> Local<Reservation> {
        self.take_key(worker, &self.key, now_us)
    }

    /// A request of tenant `key` (see [`Envoy::key_of`]).
    fn take_key<T: LeaseTick>(
        &self,
        worker: &Leases<Rc<MemorySharedData>, T>,
        key: &LimitKey,
        now_us: u64,
    ) -> Local<Reservation> {
        let rule = &self.policy.rules[0];
        worker.take(0, rule, rule.lease.as_ref().unwrap(), key, now_us)
    }

    /// The key of tenant `tenant`.
    fn key_of(&self, tenant: &str) -> LimitKey {
        let request = HttpRequest {
            headers: [(
                Cow::Borrowed("x-tenant"),
                Cow::Owned(tenant.as_bytes().to_vec()),
            )]
            .into_iter()
            .collect(),
            source_address: None,
        };
        self.policy.plan(&request).checks.remove(0).key
    }

    /// The id of tenant `key`'s allowance.
    fn id_of(&self, key: &LimitKey) -> String {
        entry_id(&self.policy.rules[0].name, key)
    }

    /// The allowance of `acme` as shared data holds it.
    fn allowance(&self, worker: &Worker) -> Allowance {
        let id = self.id_of(&self.key);
        let (bytes, _) = self.data.read(&worker.slot(&id)).unwrap();
        Allowance::decode(&bytes).unwrap()
    }

    /// Takes requests every ms from `from_us` until the worker's tick sends a call; the call,
    /// and the time after.
    fn first_call<T: LeaseTick>(
        &self,
        worker: &Leases<Rc<MemorySharedData>, T>,
        from_us: u64,
    ) -> ((LeaseRequest, SentAsks), u64) {
        let mut now = from_us;
        loop {
            self.take(worker, now);
            now += MS;
            if let Some(call) = worker.on_tick(&self.policy.rules, now) {
                return (call, now);
            }
        }
    }

    /// Takes requests every ms from `from_us` until the worker marks an ask, then sends its
    /// tick's call and answers it with `granted` units for 1 s; the time after.
    fn lease<T: LeaseTick>(
        &self,
        worker: &Leases<Rc<MemorySharedData>, T>,
        granted: u64,
        from_us: u64,
    ) -> u64 {
        self.lease_granting(worker, grant(granted), from_us)
    }

    /// As [`Envoy::lease`], answering with `grant`.
    fn lease_granting<T: LeaseTick>(
        &self,
        worker: &Leases<Rc<MemorySharedData>, T>,
        grant: LeaseGrant,
        from_us: u64,
    ) -> u64 {
        let ((request, sent), now) = self.first_call(worker, from_us);
        assert_eq!(request.asks.len(), 1);
        assert!(request.asks[0].want > 0, "{:?}", request.asks[0]);
        worker.sent(7, sent);
        worker.answered(7, Ok(vec![grant]), |_, _| {});
        now
    }
}

fn grant(granted: u64) -> LeaseGrant {
    LeaseGrant {
        granted,
        lease_ms: 1000,
        more_in_ms: 0,
        limit: 1000,
        remaining: 500,
        pace_us: 0,
        kept: None,
        share_per_ks: 0,
        crowded: false,
    }
}

fn taken(local: &Local<Reservation>) -> bool {
    matches!(local, Local::Taken { .. })
}

fn purse_units(worker: &Worker) -> u64 {
    worker
        .state
        .borrow()
        .purses
        .iter()
        .flat_map(|purses| purses.values())
        .map(|p| p.purse.units)
        .sum()
}

#[test]
fn a_busy_key_is_asked_for_then_decided_from_its_allowance_and_the_purse() {
    let envoy = Envoy::new();
    let worker = envoy.worker();
    assert!(
        matches!(envoy.take(&worker, 0), Local::NotHeld),
        "nothing leased yet"
    );
    let now = envoy.lease(&worker, 100, MS);
    assert_eq!(envoy.allowance(&worker).units, 100);
    assert!(taken(&envoy.take(&worker, now)));
    let in_purse = purse_units(&worker);
    assert_eq!(in_purse, (99 / 4).min(PURSE_UNITS));
    assert_eq!(envoy.allowance(&worker).units, 99 - in_purse);
    // The purse's units are spent with no write to shared data.
    let writes = envoy.data.writes.get();
    for i in 0..in_purse {
        assert!(taken(&envoy.take(&worker, now + i)));
    }
    assert_eq!(envoy.data.writes.get(), writes);
    assert_eq!(purse_units(&worker), 0);
}

#[test]
fn a_purse_set_larger_takes_more_at_once_and_never_more_than_a_quarter() {
    let envoy = Envoy::new();
    let worker = envoy.worker().purses_up_to(64);
    let now = envoy.lease(&worker, 1000, MS);
    assert!(taken(&envoy.take(&worker, now)));
    assert_eq!(purse_units(&worker), 64);
    assert_eq!(envoy.allowance(&worker).units, 999 - 64);

    let small = Envoy::new();
    let worker = small.worker().purses_up_to(64);
    let now = small.lease(&worker, 100, MS);
    assert!(taken(&small.take(&worker, now)));
    assert_eq!(purse_units(&worker), 99 / 4);
}

#[test]
fn workers_racing_for_one_allowance_never_spend_a_unit_twice() {
    let envoy = Envoy::new();
    let (a, b) = (Rc::new(envoy.worker()), Rc::new(envoy.worker()));
    let now = envoy.lease(&a, 40, 0);
    // Worker b takes a unit between each of a's reads and its write, once in two writes.
    let (b_in_hook, env_key, raced) = (Rc::clone(&b), envoy.key.clone(), Rc::new(Cell::new(0)));
    let policy = envoy.policy.clone();
    let races = Rc::clone(&raced);
    let b_taken = Rc::new(Cell::new(0u64));
    let b_count = Rc::clone(&b_taken);
    envoy.data.interfere(move |_, _| {
        races.set(races.get() + 1);
        if races.get() % 2 == 1 {
            let rule = &policy.rules[0];
            let local = b_in_hook.take(0, rule, rule.lease.as_ref().unwrap(), &env_key, now);
            if taken(&local) {
                b_count.set(b_count.get() + 1);
            }
        }
    });
    let mut a_taken = 0;
    for i in 0..60 {
        if taken(&envoy.take(&a, now + i)) {
            a_taken += 1;
        }
    }
    assert!(raced.get() > 0);
    let left = envoy.allowance(&a).units + purse_units(&a) + purse_units(&b);
    assert_eq!(a_taken + b_taken.get() + left, 40, "every unit once");
    assert!(b_taken.get() > 0 && a_taken > 0);
}

#[test]
fn a_key_contended_on_every_attempt_is_not_decided_here() {
    let envoy = Envoy::new();
    let worker = envoy.worker();
    let now = envoy.lease(&worker, 40, 0);
    let before = envoy.allowance(&worker);
    let encoded = before.encode();
    // Another worker rewrites the allowance (unchanged) before every write of this one.
    envoy
        .data
        .interfere(move |data, key| data.put(key, &encoded));
    assert!(matches!(envoy.take(&worker, now), Local::NotHeld));
    assert_eq!(
        envoy.allowance(&worker).units,
        before.units,
        "nothing taken"
    );
    assert_eq!(
        purse_units(&worker),
        0,
        "no unit moved to a purse: the allowance still holds them all"
    );
}

#[test]
fn units_of_a_request_denied_by_another_rule_go_back_where_they_came_from() {
    // Too few units to fill a purse: the request's unit goes back into the allowance.
    let envoy = Envoy::new();
    let worker = envoy.worker();
    let now = envoy.lease(&worker, 3, 0);
    let Local::Taken { reservation, .. } = envoy.take(&worker, now) else {
        panic!("taken from the allowance");
    };
    assert!(matches!(
        reservation.taken_from,
        TakenFrom::Allowance { .. }
    ));
    assert_eq!(purse_units(&worker), 0);
    let held = envoy.allowance(&worker).units;
    worker.give_back(&reservation, 0, &envoy.key, now + MS);
    assert_eq!(envoy.allowance(&worker).units, held + 1);

    // Taken along with a purse's units: back into that purse, under the same lease.
    let envoy = Envoy::new();
    let worker = envoy.worker();
    let now = envoy.lease(&worker, 100, 0);
    let Local::Taken { reservation, .. } = envoy.take(&worker, now) else {
        panic!("taken from the allowance, filling a purse");
    };
    assert!(matches!(reservation.taken_from, TakenFrom::Purse { .. }));
    let (held, in_purse) = (envoy.allowance(&worker).units, purse_units(&worker));
    assert_eq!(held + in_purse, 99, "one unit taken");
    worker.give_back(&reservation, 0, &envoy.key, now + MS);
    assert_eq!(purse_units(&worker), in_purse + 1);
    assert_eq!(envoy.allowance(&worker).units, held);

    // Taken from the purse: back into it.
    let Local::Taken { reservation, .. } = envoy.take(&worker, now + 2 * MS) else {
        panic!("taken from the purse");
    };
    assert!(matches!(reservation.taken_from, TakenFrom::Purse { .. }));
    let in_purse = purse_units(&worker);
    worker.give_back(&reservation, 0, &envoy.key, now + 3 * MS);
    assert_eq!(purse_units(&worker), in_purse + 1);
}

#[test]
fn units_granted_to_a_slot_another_key_took_are_given_back_at_the_next_tick() {
    let envoy = Envoy::new();
    let worker = envoy.worker();
    let ((_, sent), now) = envoy.first_call(&worker, 0);
    worker.sent(3, sent);
    // The slot goes to another key before the answer comes.
    let slot = worker.slot(&entry_id(&envoy.policy.rules[0].name, &envoy.key));
    envoy
        .data
        .put(&slot, &Allowance::new("per-tenant:other").encode());
    worker.answered(3, Ok(vec![grant(25)]), |_, _| {});
    let (request, _) = worker
        .on_tick(&envoy.policy.rules, now + MS)
        .expect("the orphaned units given back");
    let ask = &request.asks[0];
    assert_eq!((ask.want, ask.returning), (0, 25));
    assert_eq!(ask.key, envoy.key);
}

#[test]
fn an_idle_purse_goes_back_to_the_allowance_with_the_requests_it_decided() {
    let envoy = Envoy::new();
    let worker = envoy.worker();
    let now = envoy.lease(&worker, 100, 0);
    assert!(taken(&envoy.take(&worker, now)));
    assert!(taken(&envoy.take(&worker, now + MS)));
    let seen = envoy.allowance(&worker).seen;
    let in_purse = purse_units(&worker);
    let held = envoy.allowance(&worker).units;
    // A tick (25 ms here) later, unused: back in the allowance.
    worker.on_tick(&envoy.policy.rules, now + 30 * MS);
    assert_eq!(purse_units(&worker), 0);
    let a = envoy.allowance(&worker);
    assert_eq!(a.units, held + in_purse);
    assert_eq!(a.seen, seen + 1, "the request the purse decided counts");
    assert_eq!(a.last_seen_us, now + MS);
}

/// A tick that remembers the period last asked of it.
#[derive(Default)]
struct PeriodSeen(Cell<Option<Duration>>);

impl LeaseTick for PeriodSeen {
    fn set_leasing(&self, period: Option<Duration>) {
        self.0.set(period);
    }
}

/// The tick's period a worker wants once a busy key's allowance, leased with too few units,
/// is marked as asked for, and then once the key has run out of units while its ask waits.
fn periods_of_an_ask(patient: bool) -> (Option<Duration>, Option<Duration>) {
    let envoy = Envoy::new();
    let seen = Rc::new(PeriodSeen::default());
    let worker = envoy.worker_ticked_by(Rc::clone(&seen));
    let worker = if patient {
        worker.patient_asks()
    } else {
        worker
    };
    // A request a millisecond, 100 a horizon: 40 units are less than one horizon's worth.
    let mut now = envoy.lease(&worker, 40, 0);
    while worker.state.borrow().wanted.is_empty() {
        assert!(
            taken(&envoy.take(&worker, now)),
            "marked before running out"
        );
        now += MS;
    }
    let marked = seen.0.get();
    while taken(&envoy.take(&worker, now)) {
        now += MS;
        assert!(now < 100 * MS, "40 units run out");
    }
    (marked, seen.0.get())
}

#[test]
fn a_patient_ask_waits_for_the_tick_until_its_key_runs_out() {
    let (tick, ask_tick) = (Some(Duration::from_millis(25)), Some(ASK_TICK));
    assert_eq!(periods_of_an_ask(true), (tick, ask_tick));
    assert_eq!(
        periods_of_an_ask(false),
        (ask_tick, ask_tick),
        "by default an ask goes at the short tick"
    );
}

#[test]
fn a_call_s_worth_of_patient_asks_go_at_the_short_tick() {
    let envoy = Envoy::new();
    let worker = envoy.worker().patient_asks();
    let mut state = WorkerState {
        wanted: (0..MAX_ASKS - 1)
            .map(|i| (format!("slot {i}"), 1))
            .collect(),
        ..WorkerState::default()
    };
    assert_eq!(worker.period(&state), Some(Duration::from_millis(25)));
    state.wanted.push_back(("slot 64".to_owned(), 1));
    assert_eq!(worker.period(&state), Some(ASK_TICK));
}

#[test]
fn asks_beyond_a_call_s_worth_go_at_the_next_ticks_each_once_in_the_order_marked() {
    let envoy = Envoy::new();
    let worker = envoy.worker().slot_per_key().patient_asks();
    // More than a tick looks at: those beyond wait their turn too.
    let keys: Vec<LimitKey> = (0..tick::SLOTS_A_TICK + 2 * MAX_ASKS + 3)
        .map(|i| envoy.key_of(&format!("tenant {i}")))
        .collect();
    let mut marked_order: Vec<String> = Vec::new();
    let mut now = 0;
    while marked_order.len() < keys.len() {
        for key in &keys {
            envoy.take_key(&worker, key, now);
        }
        for (slot, _) in &worker.state.borrow().wanted {
            if !marked_order.contains(slot) {
                marked_order.push(slot.clone());
            }
        }
        now += MS;
        assert!(now < 1000 * MS, "every key marked an ask");
    }
    let mut asked: Vec<String> = Vec::new();
    let mut calls = Vec::new();
    while let Some((request, SentAsks(sent))) = worker.on_tick(&envoy.policy.rules, now) {
        calls.push(request.asks.len());
        asked.extend(sent.into_iter().map(|s| s.slot));
        now += MS;
        assert!(calls.len() < 20, "the asks run out");
    }
    let full_calls = tick::SLOTS_A_TICK / MAX_ASKS + 2;
    assert_eq!(calls[..full_calls], vec![MAX_ASKS; full_calls]);
    assert_eq!(calls[full_calls..], [3]);
    assert_eq!(
        asked, marked_order,
        "each key asked once, first marked first"
    );
}

#[test]
fn a_lease_shorter_than_the_ttl_is_renewed_before_it_ends() {
    // Until its grant, the key's next look is a ttl (1 s) after its last request; the grant's
    // shorter lease brings the look forward, to renew the lease before it ends.
    let envoy = Envoy::new();
    let worker = envoy.worker();
    let short = LeaseGrant {
        lease_ms: 300,
        ..grant(100)
    };
    let mut now = envoy.lease_granting(&worker, short, MS);
    let lease_until = envoy.allowance(&worker).lease_until_us;
    assert!(lease_until <= now + 300 * MS, "{lease_until}");
    // No request since: only the tick can see the lease's end coming.
    let renewal = loop {
        now += MS;
        assert!(now < lease_until, "the lease ended with no renewal");
        if let Some((request, _)) = worker.on_tick(&envoy.policy.rules, now) {
            break request;
        }
    };
    assert_eq!(renewal.asks.len(), 1);
    assert_eq!(renewal.asks[0].key, envoy.key);
    assert_eq!(renewal.asks[0].held, 100, "{:?}", renewal.asks[0]);
}

#[test]
fn a_key_used_since_its_look_was_set_is_forgotten_a_ttl_after_its_last_use() {
    // Its first use set its look a ttl (1 s) later; a use since put the look off, and the
    // tick then finds it not yet due.
    let envoy = Envoy::new();
    let worker = envoy.worker().slot_per_key().patient_asks();
    let key = envoy.key_of("tenant");
    envoy.take_key(&worker, &key, 0);
    envoy.take_key(&worker, &key, 600 * MS);
    assert!(worker.state.borrow().wanted.is_empty(), "no key asked");
    let left_after = |now_us| {
        assert!(worker.on_tick(&envoy.policy.rules, now_us).is_none());
        worker.state.borrow().touched.len()
    };
    assert_eq!(left_after(1_100 * MS), 1, "used 500 ms before");
    assert_eq!(left_after(1_500 * MS), 1, "used 900 ms before");
    assert_eq!(left_after(1_700 * MS), 0, "idle a ttl");
}

#[test]
fn a_lease_due_a_look_when_a_tick_panicked_is_looked_at_by_the_next() {
    // The module catches a panic and goes on: the leases the panicking tick was looking at
    // are still due at the next.
    let envoy = Envoy::new();
    let worker = envoy.worker();
    let mut now = envoy.lease(&worker, 100, MS);
    let lease_until = envoy.allowance(&worker).lease_until_us;
    let armed = Rc::new(Cell::new(true));
    let trigger = Rc::clone(&armed);
    envoy
        .data
        .interfere(move |_, _| assert!(!trigger.replace(false), "a bug in the tick's look"));
    let tick = |now_us| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            worker.on_tick(&envoy.policy.rules, now_us)
        }))
    };
    loop {
        now += MS;
        assert!(now < lease_until, "the lease ended with no look");
        match tick(now) {
            Err(_) => break,
            Ok(call) => assert!(call.is_none(), "no request since the grant"),
        }
    }
    let renewal = tick(now + MS).ok().flatten().map(|(request, _)| request);
    assert!(
        renewal.is_some_and(|r| r.asks.len() == 1 && r.asks[0].key == envoy.key),
        "the next tick asks for the lease"
    );
}

#[test]
fn marks_an_earlier_tick_left_count_for_none() {
    let mut marks = TickMarks::default();
    marks.note(1, 0, 5);
    assert_eq!(marks.of(1), &[(0, 5)]);
    // Tick 1 never took them (it panicked, say): tick 2 sees none, and notes its own afresh.
    assert!(marks.of(2).is_empty());
    marks.note(2, 3, 7);
    assert_eq!(marks.take(2), vec![(3, 7)]);
    assert!(marks.of(2).is_empty(), "taken once");
}

#[test]
fn leases_due_beyond_a_tick_s_worth_are_looked_at_on_the_short_ticks_after() {
    // A tick's work is done under the module's lock every worker's take needs: thousands of
    // keys gone quiet at once are forgotten a few calls' worth a tick, at the short tick.
    let envoy = Envoy::new();
    let seen = Rc::new(PeriodSeen::default());
    let worker = envoy
        .worker_ticked_by(Rc::clone(&seen))
        .slot_per_key()
        .patient_asks();
    let keys = 2 * tick::SLOTS_A_TICK + 5;
    for i in 0..keys {
        envoy.take_key(&worker, &envoy.key_of(&format!("tenant {i}")), 0);
    }
    assert!(worker.state.borrow().wanted.is_empty(), "no key asked");
    let mut now = 10_000 * MS;
    let mut left = Vec::new();
    let mut periods = Vec::new();
    while !worker.state.borrow().touched.is_empty() {
        assert!(worker.on_tick(&envoy.policy.rules, now).is_none());
        left.push(worker.state.borrow().touched.len());
        periods.push(seen.0.get());
        now += MS;
        assert!(left.len() < 10, "every quiet key forgotten");
    }
    let per_tick = tick::SLOTS_A_TICK;
    assert_eq!(left, [keys - per_tick, keys - 2 * per_tick, 0]);
    assert_eq!(periods, [Some(ASK_TICK), Some(ASK_TICK), None]);
}
