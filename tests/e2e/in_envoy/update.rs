//! A policy pushed to a running Envoy, both builds, as Istio and Envoy Gateway push a filter's
//! configuration (extension config discovery, ECDS): under load, with callouts and lease calls
//! in flight, every request is answered by a policy, each new policy takes over within seconds,
//! a rule the push leaves alone keeps its count, and what each old configuration held (its
//! lease thread, its memory) is let go.
//!
//! The Redis state of a rule a push leaves alone carries over (docs/algorithms.md); a leased
//! rule's holder is the configuration, so a push starts new leases.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice_e2e::real_envoy::{
    Backends, Plugin, Way, burst, discovered_plugin_config, eventually, publish_discovered,
    start_envoy,
};
use sluice_harness::{Envoy, http};

use super::filter::{WORKERS, both_ways, settled_stat};

/// Policies pushed after the first.
const PUSHES: usize = 8;
/// The limit of the rule every push leaves alone, over the whole test: an hour's.
const LIMIT: usize = 10;
/// Requests at once before each push.
const BURST: usize = 16;
/// How long each policy decides before the next push.
const DWELL: Duration = Duration::from_millis(300);
/// The deny cache's slots in every policy: the module's cache then takes 56 MiB, so that an
/// old configuration kept alive shows in what Envoy's allocator holds.
const DENY_CACHE_SLOTS: u32 = 1 << 20;
/// How much more Envoy's allocator may hold after the pushes than before: well under one
/// configuration's cache. (The module's grew by 0.4 MiB; before its workers dropped the
/// streams they kept for a configuration gone, five old configurations stayed, 280 MiB.)
const MAX_GROWTH_BYTES: u64 = 16 << 20;

/// Push `generation`'s policy: `per-tenant`, the same in every one, and a leased rule named
/// after the push, so that its counters say which policy decided.
fn policy(generation: usize) -> String {
    format!(
        r#"{{"cluster": "sluice", "timeout": "5s", "failure_mode": "deny",
            "deny_cache": {{"slots": {DENY_CACHE_SLOTS}}},
            "rules": [
              {{"name": "per-tenant", "key": [{{"header": "x-api-key"}}],
                "limit": {{"algorithm": "gcra", "rate": {LIMIT}, "per": "1h", "burst": {LIMIT}}}}},
              {{"name": "leased-{generation}", "key": [{{"header": "x-api-key"}}],
                "limit": {{"algorithm": "gcra", "rate": 100000, "per": "1s", "burst": 100000}},
                "lease": {{"horizon": "500ms"}}}}
            ]}}"#
    )
}

/// Waits until push `generation`'s policy decides requests: a request of a key never seen
/// (admitted by `per-tenant`) is counted under the push's leased rule. How long that took.
fn takes_over(envoy: &Envoy, way: Way, generation: usize) -> Duration {
    let started = Instant::now();
    let ingress = envoy.listener("ingress").expect("listener ingress");
    let counter = format!(
        "{}sluice.rule.leased-{generation}.allowed",
        way.stat_prefix()
    );
    let mut asked = 0;
    // The .wasm hands its counters to Envoy on a one-second tick.
    eventually(
        &format!("push {generation}'s policy decides"),
        Duration::from_secs(15),
        || {
            asked += 1;
            let key = format!("new-{generation}-{asked}");
            let answer = http::get(ingress, "/", &[("x-api-key", &key)]).expect("an answer");
            assert_eq!(answer.status, 200, "a key never seen is admitted");
            envoy.stat(&counter).unwrap_or(0) > 0
        },
    );
    started.elapsed()
}

/// The bytes Envoy's allocator holds for live objects (`/memory`'s `allocated`), which its
/// resident memory cannot say: the allocator keeps the pages it was handed back. (V8 maps the
/// .wasm's memory itself: this counts a VM's C++ side.)
fn allocated(envoy: &Envoy) -> u64 {
    let memory: serde_json::Value =
        serde_json::from_str(&envoy.admin_get("/memory").expect("/memory")).expect("JSON");
    memory["allocated"]
        .as_str()
        .and_then(|n| n.parse().ok())
        .expect("/memory's allocated bytes")
}

/// Envoy's threads.
fn threads(envoy: &Envoy) -> usize {
    let pid = envoy.pid().expect("Envoy's pid");
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("/proc")
        .count()
}

/// Sends requests of key `busy`, one at a time, until `stop`: every answer's status (0 for
/// none).
fn send_until(envoy: &Envoy, stop: &AtomicBool) -> Vec<u16> {
    let ingress = envoy.listener("ingress").expect("listener ingress");
    let mut statuses = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let answer = http::get(ingress, "/", &[("x-api-key", "busy")]);
        statuses.push(answer.map_or(0, |a| a.status));
    }
    statuses
}

fn start(way: Way, backends: &Backends, resource: &Path) -> (Envoy, impl Fn(usize) + use<>) {
    let plugin = move |generation| Plugin::sluice(&policy(generation)).via(way);
    publish_discovered(&plugin(0), resource);
    let config = discovered_plugin_config(
        &plugin(0),
        backends.server_addr(),
        backends.upstream.addr(),
        resource,
    );
    let resource = resource.to_owned();
    (start_envoy(&config, WORKERS), move |generation| {
        publish_discovered(&plugin(generation), &resource)
    })
}

both_ways! {
    fn a_policy_pushed_under_load_takes_over_keeps_the_count_and_lets_the_old_one_go(way) {
        let backends = Backends::start(&[]);
        let dir = tempfile::tempdir().expect("a directory");
        let (envoy, push) = start(way, &backends, &dir.path().join("sluice.json"));
        let _ = takes_over(&envoy, way, 0);
        let (threads_before, allocated_before) = (threads(&envoy), allocated(&envoy));
        let stop = AtomicBool::new(false);
        let statuses = std::thread::scope(|scope| {
            let sending = scope.spawn(|| send_until(&envoy, &stop));
            let mut statuses = Vec::new();
            let mut slowest = Duration::ZERO;
            for generation in 1..=PUSHES {
                // A busy moment, then calm: each worker keeps the streams of the burst for its
                // next requests, most of them deeper than a request at a time reaches.
                let answers = burst(&envoy, "/", &[("x-api-key", "busy")], BURST, BURST);
                statuses.extend(answers.iter().map(|a| a.status));
                push(generation);
                slowest = slowest.max(takes_over(&envoy, way, generation));
                // Long enough for the policy's leases to be asked for: lease calls in flight
                // when the next push comes.
                std::thread::sleep(DWELL);
            }
            stop.store(true, Ordering::Relaxed);
            statuses.extend(sending.join().expect("the sender"));
            eprintln!("{way:?}: each push decided within {} ms", slowest.as_millis());
            statuses
        });
        let allowed = statuses.iter().filter(|&&s| s == 200).count();
        let denied = statuses.iter().filter(|&&s| s == 429).count();
        eprintln!(
            "{way:?}: {PUSHES} pushes under {} requests of one key: {allowed} allowed, {denied} denied",
            statuses.len()
        );
        assert_eq!(
            allowed + denied,
            statuses.len(),
            "every request answered by a policy, allowed or denied"
        );
        assert_eq!(allowed, LIMIT, "the rule no push changed admitted its limit, once");
        // A lease thread a configuration in the module; none in the .wasm.
        eventually(
            "Envoy's threads back to what one configuration has",
            Duration::from_secs(5),
            || threads(&envoy) <= threads_before,
        );
        let allocated_after = allocated(&envoy);
        eprintln!(
            "{way:?}: Envoy's allocator held {allocated_before} bytes before the pushes, {allocated_after} after"
        );
        assert!(
            allocated_after <= allocated_before + MAX_GROWTH_BYTES,
            "Envoy's allocator held {allocated_before} bytes before {PUSHES} pushes and {allocated_after} after: an old configuration kept"
        );
        let lease_calls = settled_stat(&envoy, way, "sluice.lease_calls");
        assert!(lease_calls >= PUSHES as u64, "{lease_calls} lease calls over {PUSHES} pushes");
        for counter in ["sluice.callout_failures", "sluice.lease_call_failures"] {
            assert_eq!(settled_stat(&envoy, way, counter), 0, "{counter}");
        }
    }
}
