//! Lease mode in a real Envoy with two workers, both builds: a busy key is decided inside
//! Envoy, with a few calls to sluice-server per thousand requests, and never past its limit.

use sluice_e2e::real_envoy::{Backends, Way, burst, count_status};
use sluice_harness::Envoy;

use super::filter::{both_ways, envoy_with, settled_stat};

/// An Envoy whose one rule, `per-tenant` on `x-api-key`, leases a GCRA limit of `rate` per
/// `per` (its burst as much). Its callouts may take 5 s: one that timed out would be admitted
/// by the failure mode, past the bound, on a busy machine.
fn leasing(way: Way, backends: &Backends, rate: u64, per: &str) -> Envoy {
    let policy = format!(
        r#"{{"cluster": "sluice", "timeout": "5s", "rules": [
            {{"name": "per-tenant", "key": [{{"header": "x-api-key"}}],
              "limit": {{"algorithm": "gcra", "rate": {rate}, "per": "{per}", "burst": {rate}}},
              "lease": {{"horizon": "500ms"}}}}
        ]}}"#
    );
    envoy_with(way, backends, &policy, "FAIL_CLOSED")
}

both_ways! {
fn a_busy_leased_key_costs_a_few_calls_per_thousand_requests(way) {
    let backends = Backends::start(&[]);
    let envoy = leasing(way, &backends, 100_000, "1s");
    let requests = 3_000;
    let answers = burst(&envoy, "/", &[("x-api-key", "tenant-a")], requests, 4);
    assert_eq!(count_status(&answers, 200), requests);
    let local = settled_stat(&envoy, way, "sluice.rule.per-tenant.local");
    let callouts = settled_stat(&envoy, way, "sluice.callouts");
    let lease_calls = settled_stat(&envoy, way, "sluice.lease_calls");
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
        settled_stat(&envoy, way, "sluice.lease_call_failures"),
        0
    );
}
}

both_ways! {
    fn leased_units_admit_no_more_than_the_limit_across_workers(way) {
        // The stated bound: the units this Envoy spends never exceed what the server granted,
        // whichever worker spends them. 60 an hour, and 300 requests over both workers.
        let backends = Backends::start(&[]);
        let envoy = leasing(way, &backends, 60, "1h");
        let requests = 300;
        let answers = burst(&envoy, "/", &[("x-api-key", "tenant-a")], requests, 4);
        let allowed = count_status(&answers, 200);
        let denied = count_status(&answers, 429);
        let local = settled_stat(&envoy, way, "sluice.rule.per-tenant.local");
        eprintln!("{way:?}: {allowed} allowed, {denied} denied, {local} decided in Envoy");
        assert_eq!(allowed + denied, requests, "every answer is the limit's");
        assert!(allowed <= 60, "{allowed} admitted against a limit of 60");
        assert!(allowed >= 45, "only {allowed} of the limit's 60 admitted");
        assert!(local > 0, "nothing decided from a lease");
    }
}
