//! The same traffic decided by a real Envoy, with the .wasm and with the module, and by the
//! simulator: a recorded trace (the
//! zanbil access log, where the checkout has it) and a synthetic one with many clients, sent
//! through Envoy 1.40 in real time (sped up: the trace's own timeline is compressed, so both
//! sides see the same schedule and the same policy) and replayed by `sluice-sim` in virtual
//! time. Each request's decision record (Envoy's access log, the simulator's filter state) is
//! tallied per rule, key and outcome, and the two tallies compared. Each build of the filter is
//! held to the simulator's tally, so the two builds' per-client decisions on `exact` are equal.
//!
//! - `exact`, a sliding log whose window outlasts the replay, admits each client's first
//!   [`EXACT_LIMIT`] requests whenever they come: its counts must agree exactly.
//! - `rate`, a shadow GCRA at a few requests a second, depends on when each request arrives:
//!   a request sent δ late (the sender's lateness, measured) can move the span of a client's
//!   burst by up to 2δ, so per client its admitted count may differ by at most
//!   ⌈2 × rate × δ⌉ + 1. Shadow, so that it never changes what `exact` sees.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_e2e::real_envoy::{Backends, Way, eventually};
use sluice_e2e::{Stack, decision_record, shared_trace};
use sluice_harness::http;
use sluice_sim::Topology;
use sluice_sim::trace::synthetic::{GenOptions, Kind, generate};
use sluice_sim::trace::{ReadOptions, TraceRecord, read_file};

use super::filter::{both_ways, envoy_with};

/// Each client's requests the `exact` rule admits.
pub(super) const EXACT_LIMIT: u64 = 40;

/// The `rate` rule's rate, a second.
pub(super) const RATE: f64 = 5.0;

/// Requests in flight at once from the sender.
const SENDERS: usize = 16;

/// Decisions are compared, not latency: on two busy cores a callout past a second would be
/// Envoy's failure, not the filter's decision.
fn policy() -> String {
    format!(
        r#"{{"cluster": "sluice", "deny_cache": false, "timeout": "5s", "failure_mode": "deny", "rules": [
            {{"name": "exact", "key": [{{"header": "x-client"}}],
              "limit": {{"algorithm": "sliding_log", "limit": {EXACT_LIMIT}, "window": "1h"}}}},
            {{"name": "rate", "key": [{{"header": "x-client"}}], "shadow": true,
              "limit": {{"algorithm": "gcra", "rate": {RATE}, "per": "1s", "burst": 10}}}}
        ]}}"#
    )
}

/// `records` on a timeline `speedup` times faster, each a GET of `/` naming its client in
/// `x-client` (the policy keys on it; the client's address cannot cross into a real Envoy).
pub(super) fn compressed(records: &[TraceRecord], speedup: f64) -> Vec<TraceRecord> {
    let start = records.first().map_or(0, |r| r.time_us);
    records
        .iter()
        .map(|r| TraceRecord {
            time_us: start + ((r.time_us - start) as f64 / speedup) as i64,
            method: "GET".to_owned(),
            target: "/".to_owned(),
            headers: vec![("x-client".to_owned(), r.client.clone())],
            ..r.clone()
        })
        .collect()
}

/// (rule, key, outcome) → requests.
type Tally = BTreeMap<(String, String, String), u64>;

/// Per key: (admitted, refused).
type PerKey = BTreeMap<String, (u64, u64)>;

fn tally_records<'a>(records: impl Iterator<Item = &'a str>) -> Tally {
    let mut tally = Tally::new();
    for record in records {
        let decisions: Vec<Value> = serde_json::from_str(record)
            .unwrap_or_else(|e| panic!("a decision record: {e}: {record}"));
        for d in decisions {
            let field = |name: &str| d[name].as_str().unwrap_or_default().to_owned();
            *tally
                .entry((field("rule"), field("key"), field("outcome")))
                .or_default() += 1;
        }
    }
    tally
}

/// Sends `records` through `envoy` on their schedule; how late the latest one was sent, and
/// each one's status.
pub(super) fn send_on_schedule(
    envoy: &sluice_harness::Envoy,
    records: &[TraceRecord],
) -> (Duration, Vec<u16>) {
    let ingress = envoy.listener("ingress").expect("ingress");
    let start_us = records.first().map_or(0, |r| r.time_us);
    let next = AtomicUsize::new(0);
    let latest_us = AtomicU64::new(0);
    let statuses: Vec<AtomicU16> = records.iter().map(|_| AtomicU16::new(0)).collect();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..SENDERS {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(record) = records.get(i) else {
                        return;
                    };
                    let due = Duration::from_micros((record.time_us - start_us) as u64);
                    std::thread::sleep(due.saturating_sub(started.elapsed()));
                    let late = started.elapsed().saturating_sub(due);
                    latest_us.fetch_max(late.as_micros() as u64, Ordering::SeqCst);
                    let client = record.headers[0].1.as_str();
                    let answer =
                        http::get(ingress, "/", &[("x-client", client)]).expect("an answer");
                    statuses[i].store(answer.status, Ordering::SeqCst);
                }
            });
        }
    });
    (
        Duration::from_micros(latest_us.load(Ordering::SeqCst)),
        statuses.into_iter().map(AtomicU16::into_inner).collect(),
    )
}

/// Both sides' tallies of `records`, Envoy's with the filter built `way`, and the sender's
/// lateness.
fn decide_both(way: Way, records: &[TraceRecord]) -> (Tally, Tally, Duration) {
    let backends = Backends::start(&[]);
    let envoy = envoy_with(way, &backends, &policy(), "FAIL_CLOSED");
    let (late, _) = send_on_schedule(&envoy, records);
    eventually(
        "every request in the access log",
        Duration::from_secs(10),
        || envoy.access_log().len() == records.len(),
    );
    let log = envoy.access_log();
    let real = tally_records(log.iter().map(|line| {
        let (status, record) = line.split_once(' ').expect("status and record");
        assert!(status == "200" || status == "429", "{line}");
        record
    }));
    let stack = Stack::start(&policy());
    let done = stack.replay_with(records, &Topology::default());
    assert_eq!(done.len(), records.len());
    let records_of: Vec<String> = done
        .iter()
        .map(|d| decision_record(d).expect("a decision record"))
        .collect();
    let simulated = tally_records(records_of.iter().map(String::as_str));
    (real, simulated, late)
}

/// Per client of `rule`: (admitted, refused) in a tally.
fn per_key(tally: &Tally, rule: &str) -> PerKey {
    let mut keys = PerKey::new();
    for ((r, key, outcome), n) in tally {
        if r != rule {
            continue;
        }
        let entry = keys.entry(key.clone()).or_default();
        match outcome.as_str() {
            "allowed" => entry.0 += n,
            "denied" | "shadow_denied" => entry.1 += n,
            _ => {}
        }
    }
    keys
}

fn compare(way: Way, name: &str, records: &[TraceRecord]) {
    let (real, simulated, late) = decide_both(way, records);
    let (real_exact, sim_exact) = (per_key(&real, "exact"), per_key(&simulated, "exact"));
    let sum = |keys: &PerKey| {
        keys.values()
            .fold((0, 0), |(a, d), (ka, kd)| (a + ka, d + kd))
    };
    let (real_rate, sim_rate) = (per_key(&real, "rate"), per_key(&simulated, "rate"));
    let bound = (2.0 * RATE * late.as_secs_f64()).ceil() as u64 + 1;
    let differing: PerKey = real_rate
        .iter()
        .filter_map(|(key, r)| {
            let s = sim_rate.get(key).copied().unwrap_or_default();
            (r.0 != s.0).then(|| (key.clone(), (r.0, s.0)))
        })
        .collect();
    let widest = differing
        .values()
        .map(|(real, simulated)| real.abs_diff(*simulated))
        .max()
        .unwrap_or(0);
    eprintln!(
        "{name}, {way:?}: {} requests from {} clients, sent at most {:.1} ms late\n  exact (sliding_log {EXACT_LIMIT}/1h): Envoy {:?}, simulator {:?} (allowed, denied)\n  rate (gcra {RATE}/s, shadow): Envoy {:?}, simulator {:?}; {} of {} clients differ, by at most {widest} (bound {bound})",
        records.len(),
        real_exact.len(),
        late.as_secs_f64() * 1000.0,
        sum(&real_exact),
        sum(&sim_exact),
        sum(&real_rate),
        sum(&sim_rate),
        differing.len(),
        real_rate.len(),
    );
    assert_eq!(
        real_exact, sim_exact,
        "{name}: the exact rule decided each client alike"
    );
    assert!(
        widest <= bound,
        "{name}: the rate rule differs by {widest} for a client, over the bound {bound}: {differing:?}"
    );
}

both_ways! {
    fn envoy_and_the_simulator_decide_a_synthetic_many_client_trace_alike(way) {
        let records = generate(GenOptions {
            kind: Kind::Demo,
            seconds: 300,
            seed: 7,
            max_requests: 0,
            rate_scale: 1.0,
        });
        compare(way, "synthetic demo, 5 min at 10x", &compressed(&records, 10.0));
    }
}

both_ways! {
    fn envoy_and_the_simulator_decide_the_zanbil_trace_alike(way) {
        let Some(trace) = zanbil() else {
            return;
        };
        compare(way, "zanbil, 41 min at 80x", &compressed(&trace.records, 80.0));
    }
}

/// The zanbil trace, where the checkout has it (`shared_trace` says why not).
pub(super) fn zanbil() -> Option<sluice_sim::trace::Trace> {
    let path = shared_trace("zanbil_access_10k.log")?;
    let options = ReadOptions {
        skip_bad: true,
        ..ReadOptions::default()
    };
    Some(read_file(&path, options).expect("the zanbil trace"))
}
