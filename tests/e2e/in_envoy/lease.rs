//! Lease mode in a real Envoy with two workers: a busy key is decided inside Envoy, with a few
//! calls to sluice-server per thousand requests.

use sluice_e2e::real_envoy::{Backends, Way, burst, count_status};

use super::filter::{envoy_with, settled_stat};

#[test]
fn a_busy_leased_key_costs_a_few_calls_per_thousand_requests() {
    let backends = Backends::start(&[]);
    let envoy = envoy_with(
        Way::Wasm,
        &backends,
        r#"{"cluster": "sluice", "rules": [
            {"name": "per-tenant", "key": [{"header": "x-api-key"}],
             "limit": {"algorithm": "gcra", "rate": 100000, "per": "1s", "burst": 100000},
             "lease": {"horizon": "500ms"}}
        ]}"#,
        "FAIL_CLOSED",
    );
    let requests = 3_000;
    let answers = burst(&envoy, "/", &[("x-api-key", "tenant-a")], requests, 4);
    assert_eq!(count_status(&answers, 200), requests);
    let local = settled_stat(&envoy, Way::Wasm, "sluice.rule.per-tenant.local");
    let callouts = settled_stat(&envoy, Way::Wasm, "sluice.callouts");
    let lease_calls = settled_stat(&envoy, Way::Wasm, "sluice.lease_calls");
    let per_thousand = (callouts + lease_calls) as f64 * 1000.0 / requests as f64;
    eprintln!(
        "lease mode: {requests} requests, {local} decided in Envoy, {callouts} per-request callouts, {lease_calls} lease calls: {per_thousand:.1} calls per 1,000 requests"
    );
    assert!(
        local as f64 >= 0.9 * requests as f64,
        "{local} of {requests} decided in Envoy"
    );
    assert!(
        per_thousand <= 50.0,
        "{per_thousand:.1} calls per 1,000 requests"
    );
    assert_eq!(
        settled_stat(&envoy, Way::Wasm, "sluice.lease_call_failures"),
        0
    );
}
