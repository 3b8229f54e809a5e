//! Where allowances are kept: in slots shared by the hash of their ids (Envoy's shared data),
//! or each key in a slot of its own, removed once the key idles (the module's memory).

use std::collections::HashMap;

use super::*;

/// A worker with a slot for each key, or sharing slots.
fn worker(envoy: &Envoy, per_key: bool) -> Worker {
    if per_key {
        envoy.worker().slot_per_key()
    } else {
        envoy.worker()
    }
}

/// Two tenants whose allowances share a slot when slots are shared.
fn colliding_tenants(envoy: &Envoy) -> (LimitKey, LimitKey) {
    let shared = envoy.worker();
    let mut seen: HashMap<String, LimitKey> = HashMap::new();
    for i in 0.. {
        let key = envoy.key_of(&format!("tenant-{i}"));
        let slot = shared.slot(&envoy.id_of(&key));
        if let Some(first) = seen.insert(slot, key.clone()) {
            return (first, key);
        }
    }
    unreachable!("the tenants are endless")
}

/// The tenants asked for while two colliding tenants send a request a millisecond each for
/// 300 ms, in a worker with a slot for each key or not.
fn tenants_asked_for(per_key: bool) -> (Vec<LimitKey>, (LimitKey, LimitKey)) {
    let envoy = Envoy::new();
    let (a, b) = colliding_tenants(&envoy);
    let worker = worker(&envoy, per_key);
    let mut asked = Vec::new();
    for ms in 0..300 {
        envoy.take_key(&worker, &a, ms * MS);
        envoy.take_key(&worker, &b, ms * MS);
        if let Some((request, _)) = worker.on_tick(&envoy.policy.rules, ms * MS) {
            asked.extend(request.asks.into_iter().map(|ask| ask.key));
        }
    }
    (asked, (a, b))
}

#[test]
fn keys_whose_slots_collide_are_each_leased_with_a_slot_per_key() {
    let (asked, (a, b)) = tenants_asked_for(false);
    assert!(asked.contains(&a), "the first tenant holds the slot");
    assert!(
        !asked.contains(&b),
        "the second finds the slot held, and goes per request"
    );
    let (asked, (a, b)) = tenants_asked_for(true);
    assert!(asked.contains(&a) && asked.contains(&b), "{asked:?}");
}

/// Whether tenant `acme`'s slot is still in the shared data 3 s after its last request, its
/// give-back answered, in a worker with a slot for each key or not.
fn slot_kept_after_idling(per_key: bool) -> bool {
    let envoy = Envoy::new();
    let worker = worker(&envoy, per_key);
    let leased_at = envoy.lease(&worker, 10, 0);
    assert!(taken(&envoy.take(&worker, leased_at)));
    let slot = worker.slot(&envoy.id_of(&envoy.key));
    assert!(envoy.data.read(&slot).is_some());
    // The tick, every 25 ms: the lease ends, its units go back, and the key idles for a ttl.
    for (token, now) in (leased_at..leased_at + 3_000 * MS)
        .step_by(25_000)
        .enumerate()
    {
        if let Some((request, sent)) = worker.on_tick(&envoy.policy.rules, now) {
            assert!(
                request.asks.iter().all(|ask| ask.want == 0),
                "only gives back"
            );
            worker.sent(token as u64, sent);
            let grants = request.asks.iter().map(|_| grant(0)).collect();
            worker.answered(token as u64, Ok(grants), |_, _| {});
        }
    }
    envoy.data.read(&slot).is_some()
}

#[test]
fn a_key_s_own_slot_is_removed_once_it_idles_for_a_ttl() {
    assert!(!slot_kept_after_idling(true));
    assert!(
        slot_kept_after_idling(false),
        "a shared slot stays, for the next key to take over"
    );
}
