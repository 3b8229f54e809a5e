//! Lease mode through the real .wasm in the simulator, the real server and Redis: requests
//! decided inside Envoy, workers racing on one allowance, an outage mid-lease, and rules with
//! and without leases on one request.

use sluice_e2e::{Stack, decision_record, stat};
use sluice_host::envoy::Completed;
use sluice_sim::Topology;
use sluice_sim::replay::Observer;
use sluice_sim::trace::TraceRecord;

/// A whole second, in virtual ms.
const T: i64 = 1_763_700_000_000;

/// `count` requests of `tenant`, one every `every_us` from `start_ms`, from many clients (so
/// that they spread over the workers).
fn tenant_requests(tenant: &str, start_ms: i64, every_us: i64, count: usize) -> Vec<TraceRecord> {
    (0..count)
        .map(|i| TraceRecord {
            line: i,
            time_us: start_ms * 1000 + i as i64 * every_us,
            client: format!("10.0.{}.{}", i % 7, i % 200),
            method: "GET".to_owned(),
            target: "/api/items".to_owned(),
            host: Some("api.example".to_owned()),
            status: 200,
            bytes: 100,
            headers: vec![("x-tenant".to_owned(), tenant.to_owned())],
        })
        .collect()
}

fn tenant_rule(limit: &str, lease: &str) -> String {
    format!(
        r#"{{"name": "per-tenant", "key": [{{"header": "x-tenant"}}], "limit": {limit}, "lease": {lease}}}"#
    )
}

fn workers(n: usize) -> Topology {
    Topology {
        workers: n,
        ..Topology::default()
    }
}

fn outcome(done: &Completed, rule: &str) -> serde_json::Value {
    let record: serde_json::Value =
        serde_json::from_str(&decision_record(done).expect("a decision record")).unwrap();
    record
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == rule)
        .cloned()
        .unwrap_or_default()
}

#[test]
fn a_busy_key_is_decided_in_envoy_with_few_callouts() {
    let stack = Stack::start(&format!(
        r#"{{"cluster": "sluice", "rules": [{}]}}"#,
        tenant_rule(
            r#"{"algorithm": "gcra", "rate": 1000, "per": "1s", "burst": 1000}"#,
            r#"{"horizon": "200ms"}"#
        )
    ));
    // 500 a second for 4 seconds: within the limit.
    let records = tenant_requests("acme", T, 2_000, 2_000);
    let (done, run) = stack.run(&records, &workers(2));
    assert_eq!(done.len(), 2_000);
    assert!(done.iter().all(|d| d.status == 200), "all within the limit");
    let callouts = stat(&run, "sluice.callouts") + stat(&run, "sluice.lease_calls");
    let local = stat(&run, "sluice.rule.per-tenant.local");
    assert!(callouts <= 60, "{callouts} callouts for 2000 requests");
    assert!(local >= 1_900, "only {local} of 2000 decided in Envoy");
    assert_eq!(outcome(&done[1_999], "per-tenant")["local"], true);
}

/// Many moderately busy keys at once, more than one lease call carries: each is leased
/// within a few ticks and decided in Envoy after, not sent to the server request by request
/// until its unanswered ask runs out.
#[test]
fn many_keys_asking_at_once_are_all_leased() {
    let stack = Stack::start(&format!(
        r#"{{"cluster": "sluice", "rules": [{}]}}"#,
        tenant_rule(
            r#"{"algorithm": "gcra", "rate": 100000, "per": "1s", "burst": 100000}"#,
            r#"{"horizon": "500ms"}"#
        )
    ));
    // 300 tenants in step (a lease call carries at most 64 asks, and all 300 ask in the same
    // tick), each at 20 a second for 3 seconds.
    let (tenants, every_us, per_tenant) = (300, 50_000, 60);
    let mut records: Vec<TraceRecord> = (0..tenants)
        .flat_map(|t| tenant_requests(&format!("tenant-{t}"), T, every_us, per_tenant))
        .collect();
    records.sort_by_key(|r| r.time_us);
    for (i, r) in records.iter_mut().enumerate() {
        r.line = i;
    }
    let (done, run) = stack.run(&records, &workers(1));
    assert!(done.iter().all(|d| d.status == 200), "all within the limit");
    let callouts = stat(&run, "sluice.callouts") + stat(&run, "sluice.lease_calls");
    let per_thousand = callouts as f64 * 1000.0 / records.len() as f64;
    // Each key's first requests go to the server while its rate is learned and its ask is
    // answered: about three of its 60.
    assert!(
        per_thousand <= 80.0,
        "{callouts} callouts for {} requests: {per_thousand:.0} per 1,000",
        records.len()
    );
    // In the last second every key is decided in Envoy.
    let last_second_ns = (T as u64 + 2_000) * 1_000_000;
    let late_remote = done
        .iter()
        .filter(|d| d.started_ns >= last_second_ns && outcome(d, "per-tenant")["local"] != true)
        .count();
    assert_eq!(
        late_remote, 0,
        "requests in the last second decided by the server"
    );
}

/// Four workers spend one Envoy's allowances at once, and the key's limit (200 in the hour,
/// no refill) is offered ten times over: every unit Redis gave out, by lease or per request,
/// admits exactly one request, and nothing else is admitted.
#[test]
fn workers_racing_on_one_allowance_admit_exactly_the_units_leased() {
    let stack = Stack::start(&format!(
        r#"{{"cluster": "sluice", "rules": [{}]}}"#,
        tenant_rule(
            r#"{"algorithm": "fixed_window", "limit": 200, "window": "1h"}"#,
            r#"{"horizon": "100ms", "max_share": 0.5, "max_total_share": 1}"#
        )
    ));
    let records = tenant_requests("acme", T, 500, 2_000);
    let (done, run) = stack.run(&records, &workers(4));
    let admitted = done.iter().filter(|d| d.status == 200).count();
    let leased = stat(&run, "sluice.rule.per-tenant.lease_units");
    let window = stack
        .redis
        .cli(&["GET", "sluice:{per-tenant:acme}:fw:200/3600000"])
        .unwrap();
    let counted: u64 = window.trim().split(':').nth(1).unwrap().parse().unwrap();
    assert_eq!(counted, 200, "Redis gave out the whole limit");
    assert_eq!(admitted, 200, "exactly the units Redis gave out");
    let local = done
        .iter()
        .filter(|d| d.status == 200 && outcome(d, "per-tenant")["local"] == true)
        .count() as i64;
    let by_request = admitted as i64 - local;
    assert!(local > 150, "most were admitted in Envoy: {local}");
    assert_eq!(
        local, leased,
        "each leased unit admitted one request ({by_request} admitted per request)"
    );
    assert_eq!(local + by_request, 200);
}

/// Stops Redis when the first request at or after `at_us` completes.
struct Outage<'a> {
    redis: &'a sluice_harness::RedisServer,
    at_us: i64,
    done: bool,
    completed: Vec<Completed>,
    times: Vec<i64>,
}

impl Observer for Outage<'_> {
    fn completed(&mut self, _instance: usize, done: Completed, record: &TraceRecord) {
        if !self.done && record.time_us >= self.at_us {
            self.done = true;
            let _ = self.redis.cli(&["SHUTDOWN", "NOSAVE"]);
        }
        self.times.push(record.time_us);
        self.completed.push(done);
    }
}

/// Redis goes away mid-lease: the Envoy keeps deciding from what it holds until its lease
/// ends, then the rule's failure mode (here: deny) applies, and the failures are counted.
#[test]
fn with_redis_gone_an_envoy_spends_what_it_holds_until_the_lease_ends() {
    let stack = Stack::start(&format!(
        r#"{{"cluster": "sluice", "failure_mode": "deny", "timeout": "20ms", "rules": [{}]}}"#,
        tenant_rule(
            r#"{"algorithm": "gcra", "rate": 1000, "per": "1s", "burst": 1000}"#,
            r#"{"horizon": "500ms", "max_share": 1, "max_total_share": 1, "ttl": "1s"}"#
        )
    ));
    // 100 a second for 3.5 seconds; Redis stops 2 seconds in. (Each failed callout waits for
    // its timeout in real time: the tail after the lease is kept short.)
    let records = tenant_requests("acme", T, 10_000, 350);
    let outage_us = (T + 2_000) * 1000;
    let mut outage = Outage {
        redis: &stack.redis,
        at_us: outage_us,
        done: false,
        completed: Vec::new(),
        times: Vec::new(),
    };
    let run = stack.run_observed(&records, &workers(2), &mut outage);
    let ttl_us = 1_000_000;
    let mut local_after = 0;
    let mut last_local_us = 0;
    let mut first_failure_us = i64::MAX;
    for (done, &time) in outage.completed.iter().zip(&outage.times) {
        let rule = outcome(done, "per-tenant");
        if rule["local"] == true && done.status == 200 {
            last_local_us = last_local_us.max(time);
            local_after += usize::from(time > outage_us);
        }
        if rule["outcome"] == "failed" {
            assert_eq!(done.status, 503, "failure mode deny");
            first_failure_us = first_failure_us.min(time);
        }
    }
    assert!(
        local_after >= 20,
        "decided from the lease after the outage: {local_after}"
    );
    assert!(
        last_local_us <= outage_us + ttl_us,
        "no unit spent after the lease ended"
    );
    assert!(first_failure_us > outage_us, "no failure before the outage");
    assert!(
        first_failure_us <= outage_us + ttl_us + 20_000,
        "the failure mode applies once the lease has ended"
    );
    assert!(last_local_us < first_failure_us);
    assert!(stat(&run, "sluice.rule.per-tenant.lease_failures") > 0);
    assert!(stat(&run, "sluice.rule.per-tenant.failures") > 0);
}

/// A leased rule and a per-request rule on one request: when the per-request rule denies, the
/// unit taken from the lease goes back, so the tenant's limit is not drained by requests it
/// never let through.
#[test]
fn a_request_denied_by_a_per_request_rule_gives_back_its_leased_unit() {
    let stack = Stack::start(&format!(
        r#"{{"cluster": "sluice", "deny_cache": false, "rules": [{}, {}]}}"#,
        tenant_rule(
            r#"{"algorithm": "fixed_window", "limit": 100, "window": "1h"}"#,
            r#"{"horizon": "50ms", "max_share": 0.5}"#
        ),
        r#"{"name": "per-client", "key": ["client_ip"], "limit": {"algorithm": "fixed_window", "limit": 1, "window": "1h"}}"#
    ));
    // 60 clients one after another, each knocking 10 times; the tenant allows 100.
    let mut records = Vec::new();
    for client in 0..60 {
        for knock in 0..10 {
            let mut r = tenant_requests("acme", T, 0, 1).remove(0);
            r.time_us = (T + client * 100) * 1000 + knock * 2_000;
            r.client = format!("192.0.2.{client}");
            r.line = records.len();
            records.push(r);
        }
    }
    let (done, run) = stack.run(&records, &workers(2));
    let admitted = done.iter().filter(|d| d.status == 200).count();
    assert_eq!(
        admitted, 60,
        "every client's first request, the tenant never in the way"
    );
    assert!(
        stat(&run, "sluice.rule.per-tenant.local") > 0,
        "the tenant rule was decided from its lease"
    );
    assert_eq!(stat(&run, "sluice.rule.per-tenant.denied"), 0);
    assert_eq!(stat(&run, "sluice.rule.per-client.denied"), 540);
}

/// A worker that goes quiet holding units in its purse puts them back in the Envoy's
/// allowance at its next tick, where the worker still busy spends them: the key's whole limit
/// (200 in the hour, no refill) is admitted, none of it stranded with the quiet worker.
#[test]
fn units_left_with_a_quiet_worker_are_spent_by_a_busy_one() {
    let stack = Stack::start(&format!(
        r#"{{"cluster": "sluice", "rules": [{}]}}"#,
        tenant_rule(
            r#"{"algorithm": "fixed_window", "limit": 200, "window": "1h"}"#,
            r#"{"horizon": "100ms", "max_share": 1, "max_total_share": 1}"#
        )
    ));
    // Both workers busy for 200 ms, then a single client (one connection, one worker) for
    // 800 ms more, offering twice what is left.
    let mut records = tenant_requests("acme", T, 2_000, 100);
    let quiet_from_us = records.last().unwrap().time_us + 100_000;
    records.extend(
        tenant_requests("acme", 0, 2_000, 400)
            .into_iter()
            .map(|r| TraceRecord {
                time_us: quiet_from_us + r.time_us,
                client: "10.9.9.9".to_owned(),
                ..r
            }),
    );
    for (i, r) in records.iter_mut().enumerate() {
        r.line = i;
    }
    let (done, run) = stack.run(&records, &workers(2));
    let admitted = done.iter().filter(|d| d.status == 200).count();
    assert!(
        stat(&run, "sluice.rule.per-tenant.local") > 150,
        "decided in Envoy from leases"
    );
    assert_eq!(admitted, 200, "the whole limit, and no more");
}
