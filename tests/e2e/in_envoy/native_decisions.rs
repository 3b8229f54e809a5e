//! The same traffic decided by a real Envoy's native rate limit filter and by the simulator's
//! model of it: a recorded trace (zanbil, where the checkout has it) and a synthetic one with
//! many clients, sent through Envoy 1.40 on a compressed timeline and replayed by `sluice-sim`
//! in virtual time, both asking sluice-server's gRPC API.
//!
//! Two filters in the chain, as stages: the first (domain `exact`, a sliding log whose window
//! outlasts the replay) answers 429, the second (domain `rate`, a GCRA at a few requests a
//! second) answers 503. Per client, what passed the first must be equal on both sides; what
//! passed the second may differ by the lateness bound of `decisions.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_e2e::real_envoy::Backends;
use sluice_harness::Envoy;
use sluice_server::rls::config::WatchedConfig;
use sluice_sim::launch::{ServedConfigs, Services};
use sluice_sim::native::NativeConfig;
use sluice_sim::native::replay::{NativeSetup, replay};
use sluice_sim::trace::TraceRecord;
use sluice_sim::trace::synthetic::{GenOptions, Kind, generate};

use super::decisions::{EXACT_LIMIT, RATE, compressed, send_on_schedule, zanbil};
use super::native_model::native_config;

/// Every request names its client in `x-client` (the client's address cannot cross into a
/// real Envoy), and each filter sends it as its one descriptor.
const ROUTES: &str = r#"              rate_limits:
              - stage: 0
                actions: [{request_headers: {header_name: x-client, descriptor_key: client}}]
              - stage: 1
                actions: [{request_headers: {header_name: x-client, descriptor_key: client}}]
              routes:
              - match: {prefix: "/"}
                route: {cluster: upstream}"#;

/// The first stage answers 429, the second 503.
const FILTERS: [(&str, &str); 2] = [
    ("exact", "              stage: 0"),
    (
        "rate",
        "              stage: 1\n              rate_limited_status: {code: 503}",
    ),
];

fn limits() -> [(&'static str, String); 2] {
    [
        (
            "exact.yaml",
            format!(
                "domain: exact\ndescriptors:\n  - key: client\n    rate_limit:\n      unit: hour\n      requests_per_unit: {EXACT_LIMIT}\n      sluice: {{algorithm: sliding_log, limit: {EXACT_LIMIT}, window: 1h}}\n"
            ),
        ),
        (
            "rate.yaml",
            format!(
                "domain: rate\ndescriptors:\n  - key: client\n    rate_limit:\n      unit: second\n      requests_per_unit: {RATE}\n      sluice: {{algorithm: gcra, rate: {RATE}, per: 1s, burst: 10}}\n"
            ),
        ),
    ]
}

/// Per client: (passed the exact filter, passed both), from each request's status.
type PerClient = BTreeMap<String, (u64, u64)>;

fn per_client(records: &[TraceRecord], statuses: &[u16]) -> PerClient {
    let mut clients = PerClient::new();
    for (record, status) in records.iter().zip(statuses) {
        assert!(matches!(status, 200 | 429 | 503), "status {status}");
        let entry = clients.entry(record.headers[0].1.clone()).or_default();
        entry.0 += u64::from(*status != 429);
        entry.1 += u64::from(*status == 200);
    }
    clients
}

fn compare(name: &str, records: &[TraceRecord]) {
    // The test upstream answers 200 whatever the trace recorded, and so does the model's.
    let records: Vec<TraceRecord> = records
        .iter()
        .map(|r| TraceRecord {
            status: 200,
            ..r.clone()
        })
        .collect();
    let records = records.as_slice();
    let dir = tempfile::tempdir().expect("a directory");
    let rls = dir.path().join("ratelimit");
    std::fs::create_dir_all(&rls).expect("a directory");
    for (file, text) in limits() {
        std::fs::write(rls.join(file), text).expect("the limits");
    }
    let backends = Backends::start(&["--rls-config", rls.to_str().expect("UTF-8")]);
    let config = native_config("", ROUTES, &FILTERS, &backends);
    let envoy = Envoy::start(&config, 2).expect("Envoy");
    let (late, real_statuses) = send_on_schedule(&envoy, records);
    let real = per_client(records, &real_statuses);

    let model = NativeConfig::parse(&config).expect("the model takes the configuration");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let watched = WatchedConfig::load(vec![rls.clone()]).expect("the limits");
    let limits = watched.current();
    let served = ServedConfigs {
        rls: Some(watched),
        rlqs: None,
    };
    let services = Services::start(&runtime, None, None, served).expect("a server and Redis");
    let setup = NativeSetup {
        config: &model,
        limits: &limits,
        instances: 1,
        callout_latency: Duration::from_millis(1),
    };
    let mut simulated_statuses = vec![0; records.len()];
    let (stats, _) = replay(
        &setup,
        records,
        &services.endpoint(),
        &runtime,
        &mut |d| simulated_statuses[d.index] = d.status,
        &mut |_| {},
    );
    services.stop(&runtime);
    assert_eq!(stats.failed_calls, 0, "{:?}", stats.first_failure);
    let simulated = per_client(records, &simulated_statuses);

    let bound = (2.0 * RATE * late.as_secs_f64()).ceil() as u64 + 1;
    let exact = |c: &PerClient| {
        c.iter()
            .map(|(k, v)| (k.clone(), v.0))
            .collect::<BTreeMap<_, _>>()
    };
    let widest = real
        .iter()
        .map(|(k, r)| r.1.abs_diff(simulated.get(k).map_or(0, |s| s.1)))
        .max()
        .unwrap_or(0);
    let total = |c: &PerClient| c.values().fold((0, 0), |(a, b), (x, y)| (a + x, b + y));
    eprintln!(
        "{name}: {} requests from {} clients, sent at most {:.1} ms late; (passed exact, passed both): Envoy {:?}, simulator {:?}; rate differs by at most {widest} a client (bound {bound})",
        records.len(),
        real.len(),
        late.as_secs_f64() * 1000.0,
        total(&real),
        total(&simulated),
    );
    assert_eq!(
        exact(&real),
        exact(&simulated),
        "{name}: the exact filter decided each client alike"
    );
    assert!(
        widest <= bound,
        "{name}: the rate filter differs by {widest} for a client, over {bound}"
    );
}

#[test]
fn the_native_filter_and_its_model_decide_a_synthetic_many_client_trace_alike() {
    let records = generate(GenOptions {
        kind: Kind::Demo,
        seconds: 300,
        seed: 7,
        max_requests: 0,
        rate_scale: 1.0,
    });
    compare("synthetic demo, 5 min at 10x", &compressed(&records, 10.0));
}

#[test]
fn the_native_filter_and_its_model_decide_the_zanbil_trace_alike() {
    let Some(trace) = zanbil() else {
        return;
    };
    compare("zanbil, 41 min at 80x", &compressed(&trace.records, 80.0));
}
