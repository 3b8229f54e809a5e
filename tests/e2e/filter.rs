//! The filter's features, each through the real .wasm hosted by the simulator, the real server
//! and a real Redis (or, for failures, a service that fails on purpose).

use std::time::Duration;

use sluice_e2e::misbehaving::{self, Misbehaviour};
use sluice_e2e::{Stack, decision_record, envoy_stat, header, request, stat};
use sluice_host::Host;
use sluice_host::envoy::{Completed, Envoy, EnvoyConfig, Output, Request, StartError};
use sluice_host::header_map::HeaderMap;
use sluice_host::state::CalloutReply;
use sluice_sim::Topology;
use sluice_sim::replay::Clock;
use sluice_sim::trace::TraceRecord;

/// A whole second.
const T: i64 = 1_763_700_000_000;

fn statuses(done: &[Completed]) -> Vec<u16> {
    done.iter().map(|d| d.status).collect()
}

#[test]
fn two_rules_per_ip_and_per_route_are_decided_in_one_callout() {
    let stack = Stack::start(
        r#"{"cluster": "sluice", "deny_cache": false, "rules": [
            {"name": "per-ip", "key": ["client_ip"], "limit": {"algorithm": "fixed_window", "limit": 3, "window": "1m"}},
            {"name": "per-route", "key": ["method", "path"], "limit": {"algorithm": "fixed_window", "limit": 5, "window": "1m"}}
        ]}"#,
    );
    // Two clients on one route: each may pass 3 times, the route 5 times.
    let mut records: Vec<TraceRecord> = Vec::new();
    for i in 0..4 {
        records.push(request(T + i * 10, "192.0.2.1", "/orders"));
        records.push(request(T + i * 10 + 5, "192.0.2.2", "/orders"));
    }
    let (done, run) = stack.run(&records, &Topology::default());
    assert_eq!(
        stat(&run, "sluice.callouts"),
        8,
        "one callout per request, for both rules"
    );
    assert_eq!(statuses(&done), [200, 200, 200, 200, 200, 429, 429, 429]);
    let record = decision_record(&done[0]).unwrap();
    assert_eq!(
        record,
        r#"[{"rule":"per-ip","key":"192.0.2.1","outcome":"allowed"},{"rule":"per-route","key":"GET:/orders","outcome":"allowed"}]"#
    );
    // The sixth request would pass per-ip (its client's third) but the route is spent: denied,
    // and per-ip consumes nothing (skipped), so that client still has its third request.
    assert_eq!(
        decision_record(&done[5]).unwrap(),
        r#"[{"rule":"per-ip","key":"192.0.2.2","outcome":"skipped"},{"rule":"per-route","key":"GET:/orders","outcome":"denied"}]"#
    );
    // The seventh is over both limits: both deny.
    assert_eq!(
        decision_record(&done[6]).unwrap(),
        r#"[{"rule":"per-ip","key":"192.0.2.1","outcome":"denied"},{"rule":"per-route","key":"GET:/orders","outcome":"denied"}]"#
    );
    // The eighth is the second client's third again: per-ip would admit, the route denies.
    assert_eq!(
        decision_record(&done[7]).unwrap(),
        r#"[{"rule":"per-ip","key":"192.0.2.2","outcome":"skipped"},{"rule":"per-route","key":"GET:/orders","outcome":"denied"}]"#
    );
    assert_eq!(stat(&run, "sluice.rule.per-ip.denied"), 1);
    assert_eq!(stat(&run, "sluice.rule.per-route.denied"), 3);
}

#[test]
fn a_shadow_rule_decides_and_counts_but_never_denies() {
    let stack = Stack::start(
        r#"{"cluster": "sluice", "rules": [
            {"name": "would-limit", "key": ["client_ip"], "shadow": true, "limit": {"algorithm": "gcra", "rate": 1, "per": "1s", "burst": 2}}
        ]}"#,
    );
    let records: Vec<TraceRecord> = (0..10).map(|_| request(T, "192.0.2.9", "/")).collect();
    let (done, run) = stack.run(&records, &Topology::default());
    assert!(
        done.iter().all(|d| d.status == 200),
        "{:?}",
        statuses(&done)
    );
    assert_eq!(stat(&run, "sluice.rule.would-limit.shadow_denied"), 8);
    assert_eq!(stat(&run, "sluice.rule.would-limit.allowed"), 2);
    assert_eq!(stat(&run, "sluice.rule.would-limit.denied"), 0);
    assert!(
        decision_record(&done[9])
            .unwrap()
            .contains(r#""outcome":"shadow_denied""#)
    );
}

fn header_policy(style: &str) -> String {
    format!(
        r#"{{"cluster": "sluice", "response": {{"headers": "{style}", "on_allowed": true, "status": 420, "body": "calm down\n"}},
            "rules": [
              {{"name": "per-ip", "key": ["client_ip"], "limit": {{"algorithm": "fixed_window", "limit": 2, "window": "1m"}}}},
              {{"name": "loose", "key": [{{"const": "all"}}], "limit": {{"algorithm": "fixed_window", "limit": 100, "window": "1m"}}}}
            ]}}"#
    )
}

fn headers_of(done: &Completed) -> Vec<(String, String)> {
    let mut h: Vec<(String, String)> = done
        .headers
        .iter()
        .filter(|(k, _)| {
            k.starts_with("x-ratelimit") || k.starts_with("ratelimit") || k == "retry-after"
        })
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
        .collect();
    h.sort();
    h
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn x_ratelimit_headers_carry_exact_values_on_allowed_and_denied_responses() {
    let stack = Stack::start(&header_policy("x-ratelimit"));
    // 15 s into a minute window: 45 s to its reset.
    let records: Vec<TraceRecord> = (0..3)
        .map(|_| request(T + 15_000, "192.0.2.3", "/"))
        .collect();
    let done = stack.replay(&records);
    assert_eq!(statuses(&done), [200, 200, 420]);
    // The most constrained rule (per-ip: least remaining) speaks on allowed responses.
    assert_eq!(
        headers_of(&done[0]),
        pairs(&[
            ("x-ratelimit-limit", "2"),
            ("x-ratelimit-remaining", "1"),
            ("x-ratelimit-reset", "45")
        ])
    );
    assert_eq!(
        headers_of(&done[1]),
        pairs(&[
            ("x-ratelimit-limit", "2"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "45")
        ])
    );
    assert_eq!(
        headers_of(&done[2]),
        pairs(&[
            ("retry-after", "45"),
            ("x-ratelimit-limit", "2"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "45")
        ])
    );
    assert_eq!(header(&done[2], "content-type"), Some("text/plain"));
    assert_eq!(
        header(&done[2], "content-length"),
        Some("10"),
        "the configured body"
    );
}

#[test]
fn ietf_headers_carry_exact_values_on_allowed_and_denied_responses() {
    let stack = Stack::start(&header_policy("ietf"));
    let records: Vec<TraceRecord> = (0..3)
        .map(|_| request(T + 15_000, "192.0.2.4", "/"))
        .collect();
    let done = stack.replay(&records);
    assert_eq!(statuses(&done), [200, 200, 420]);
    assert_eq!(
        headers_of(&done[0]),
        pairs(&[
            ("ratelimit", "\"per-ip\";r=1;t=45"),
            ("ratelimit-policy", "\"per-ip\";q=2;w=60")
        ])
    );
    assert_eq!(
        headers_of(&done[2]),
        pairs(&[
            ("ratelimit", "\"per-ip\";r=0;t=45"),
            ("ratelimit-policy", "\"per-ip\";q=2;w=60"),
            ("retry-after", "45")
        ])
    );
}

#[test]
fn no_rate_limit_headers_when_the_style_is_none() {
    let stack = Stack::start(&header_policy("none"));
    let records: Vec<TraceRecord> = (0..3).map(|_| request(T, "192.0.2.5", "/")).collect();
    let done = stack.replay(&records);
    assert_eq!(headers_of(&done[0]), Vec::<(String, String)>::new());
    assert_eq!(headers_of(&done[2]), pairs(&[("retry-after", "60")]));
}

/// Every way the service can fail to answer, under each failure mode.
#[test]
fn every_failure_cause_applies_the_failure_mode_and_is_counted() {
    let causes = [
        ("timeout", Some(Misbehaviour::Hang)),
        ("refused", None),
        (
            "non-200",
            Some(Misbehaviour::Answer(500, r#"{"error":"boom"}"#)),
        ),
        (
            "garbage body",
            Some(Misbehaviour::Answer(200, "<html>not json</html>")),
        ),
        (
            "wrong number of results",
            Some(Misbehaviour::Answer(200, r#"{"results":[]}"#)),
        ),
        ("reset mid-answer", Some(Misbehaviour::ResetMidBody)),
    ];
    for (mode, status) in [("allow", 200), ("deny", 503)] {
        let stack = Stack::start(&format!(
            r#"{{"cluster": "sluice", "timeout": "200ms", "failure_mode": "{mode}",
                "rules": [{{"name": "r", "key": ["client_ip"], "limit": {{"algorithm": "gcra", "rate": 5, "per": "1s", "burst": 5}}}}]}}"#
        ));
        for (cause, misbehaviour) in &causes {
            let url = match misbehaviour {
                Some(m) => format!(
                    "http://{}",
                    stack.runtime.block_on(misbehaving::start(m.clone()))
                ),
                None => format!("http://127.0.0.1:{}", sluice_harness::free_port().unwrap()),
            };
            let records: Vec<TraceRecord> =
                (0..3).map(|i| request(T + i, "192.0.2.6", "/")).collect();
            let (done, run) = stack.run_via(&url, &records, &Topology::default());
            assert_eq!(
                statuses(&done),
                [status; 3],
                "{cause} under failure_mode {mode}"
            );
            assert!(
                decision_record(&done[0])
                    .unwrap()
                    .contains(r#""outcome":"failed""#),
                "{cause}"
            );
            assert_eq!(stat(&run, "sluice.callout_failures"), 3, "{cause}");
            assert_eq!(stat(&run, "sluice.rule.r.failures"), 3, "{cause}");
            assert!(
                run.envoys.iter().all(|e| e.failed(0).is_none()),
                "{cause}: the VM must not trap"
            );
        }
    }
}

/// In virtual time a callout times out by its modelled latency, not by how long the machine
/// took: an answer modelled at the policy's timeout or later is a timeout, one just before it
/// is not.
#[test]
fn in_virtual_time_a_callout_times_out_when_its_modelled_latency_reaches_the_timeout() {
    let stack = Stack::start(
        r#"{"cluster": "sluice", "timeout": "100ms", "failure_mode": "deny",
            "rules": [{"name": "r", "key": ["client_ip"], "limit": {"algorithm": "gcra", "rate": 5, "per": "1s", "burst": 5}}]}"#,
    );
    for (latency_ms, status, failures) in [(99, 200, 0), (100, 503, 3)] {
        let topology = Topology {
            clock: Clock::Virtual {
                callout_latency: Duration::from_millis(latency_ms),
            },
            ..Topology::default()
        };
        let client = format!("192.0.2.{latency_ms}");
        let records: Vec<TraceRecord> = (0..3).map(|i| request(T + i, &client, "/")).collect();
        let (done, run) = stack.run(&records, &topology);
        assert_eq!(
            statuses(&done),
            [status; 3],
            "answered after {latency_ms} ms"
        );
        assert_eq!(stat(&run, "sluice.callout_failures"), failures);
    }
}

#[test]
fn the_deny_cache_answers_without_a_callout_until_the_denial_expires_across_workers() {
    let stack = Stack::start(
        r#"{"cluster": "sluice", "rules": [
            {"name": "per-route", "key": ["path"], "limit": {"algorithm": "gcra", "rate": 1, "per": "10s", "burst": 1}}
        ]}"#,
    );
    // Many clients (so both workers serve some) on one route: its key is shared.
    let client = |i: i64| format!("198.51.100.{}", 1 + i % 50);
    let mut records = vec![
        request(T, &client(0), "/export"),
        request(T + 1, &client(1), "/export"),
    ];
    records.extend((0..40).map(|i| request(T + 100 + i * 200, &client(i + 2), "/export")));
    records.push(request(T + 10_001, &client(3), "/export"));
    let topology = Topology {
        workers: 2,
        ..Topology::default()
    };
    let (done, run) = stack.run(&records, &topology);
    let by_time: Vec<u16> = statuses(&done);
    assert_eq!(by_time[0], 200);
    assert!(by_time[1..42].iter().all(|s| *s == 429), "{by_time:?}");
    assert_eq!(
        *by_time.last().unwrap(),
        200,
        "after the denial expires the service is asked again"
    );
    // The first two asked the service; the 40 within the denial were answered locally, by both
    // workers; the last one asked again.
    assert_eq!(stat(&run, "sluice.callouts"), 3);
    assert_eq!(stat(&run, "sluice.rule.per-route.cache_hits"), 40);
    let workers: std::collections::HashSet<usize> = done
        .iter()
        .filter(|d| decision_record(d).is_some_and(|r| r.contains("cached_deny")))
        .map(|d| d.worker)
        .collect();
    assert_eq!(workers.len(), 2, "both workers read the shared cache");
    let cached = done
        .iter()
        .find(|d| decision_record(d).is_some_and(|r| r.contains("cached_deny")))
        .unwrap();
    assert!(header(cached, "retry-after").is_some());
}

#[test]
fn shaping_holds_requests_so_that_they_leave_at_the_rate() {
    let stack = Stack::start(
        r#"{"cluster": "sluice", "rules": [
            {"name": "smooth", "key": [{"const": "all"}],
             "limit": {"algorithm": "leaky_bucket", "rate": 10, "per": "1s", "burst": 20, "mode": "shaping", "max_wait": "500ms"}}
        ]}"#,
    );
    let records: Vec<TraceRecord> = (0..8).map(|_| request(T, "192.0.2.7", "/")).collect();
    let (done, run) = stack.run(&records, &Topology::default());
    let mut departures: Vec<(u16, u64)> = done
        .iter()
        .map(|d| (d.status, (d.ended_ns - d.started_ns) / 1_000_000))
        .collect();
    departures.sort_by_key(|(_, ms)| *ms);
    // Waits of 0, 100, ..., 500 ms (within the 5 ms tick); the 7th and 8th would wait longer.
    let passed: Vec<u64> = departures
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, ms)| *ms)
        .collect();
    assert_eq!(passed.len(), 6, "{departures:?}");
    for (i, waited) in passed.iter().enumerate() {
        let expected = i as u64 * 100;
        assert!(
            (expected..expected + 10).contains(waited),
            "request {i} left after {waited} ms, not {expected}: {departures:?}"
        );
    }
    assert_eq!(departures.iter().filter(|(s, _)| *s == 429).count(), 2);
    assert_eq!(stat(&run, "sluice.rule.smooth.shaped"), 5);
}

/// Two requests carrying `api_key` in `x-api-key`, under a rule that admits one a minute per key.
fn twice_with_api_key(api_key: &str) -> Vec<Completed> {
    let stack = Stack::start(
        r#"{"cluster": "sluice", "rules": [
            {"name": "per-key", "key": [{"header": "x-api-key"}], "limit": {"algorithm": "fixed_window", "limit": 1, "window": "1m"}}
        ]}"#,
    );
    let mut keyed = request(T, "192.0.2.8", "/");
    keyed.headers.push(("x-api-key".into(), api_key.into()));
    stack.replay(&[keyed.clone(), keyed])
}

#[test]
fn header_values_that_are_not_utf8_are_keys_like_any_other() {
    let done = twice_with_api_key("caf\u{e9} {}:%");
    assert_eq!(statuses(&done), [200, 429]);
    assert_eq!(
        decision_record(&done[0]).unwrap(),
        r#"[{"rule":"per-key","key":"caf%C3%A9%20%7B%7D%3A%25","outcome":"allowed"}]"#
    );
}

#[test]
fn an_empty_header_value_is_a_key_like_any_other() {
    let done = twice_with_api_key("");
    assert_eq!(statuses(&done), [200, 429]);
    assert_eq!(
        decision_record(&done[0]).unwrap(),
        r#"[{"rule":"per-key","key":"","outcome":"allowed"}]"#
    );
}

#[test]
fn a_bad_configuration_is_refused_at_configure_naming_the_field() {
    let host = Host::new().unwrap();
    let wasm = sluice_e2e::filter_wasm();
    let config = br#"{"cluster": "sluice", "rules": [{"name": "r", "key": ["client_ip"], "limit": {"algorithm": "gcra", "rate": 10, "per": "1s"}}]}"#;
    let Err(err) = Envoy::start_with(
        &host,
        &wasm,
        EnvoyConfig::new(config.to_vec(), ["sluice".to_owned()]),
        0,
    ) else {
        panic!("the configuration was accepted");
    };
    let err = err.downcast::<StartError>().unwrap();
    let StartError::Rejected { log } = &err else {
        panic!("{err}")
    };
    assert!(
        log.iter().any(|l| l.starts_with(
            "sluice: invalid configuration: rules[0].limit: algorithm `gcra` needs `burst`"
        )),
        "{log:?}"
    );
}

/// Envoy's stats sinks read the counters on their own schedule; the filter keeps its
/// increments and hands them over on its tick (a host call per counter per request was the
/// largest share of its host calls), so a request must show in Envoy's stats within a second.
#[test]
fn a_request_shows_in_envoys_stats_within_a_second() {
    const SECOND_NS: u64 = 1_000_000_000;
    let host = Host::new().unwrap();
    let policy = r#"{"cluster": "sluice", "deny_cache": false, "rules": [
        {"name": "r", "key": ["client_ip"], "limit": {"algorithm": "fixed_window", "limit": 5, "window": "1m"}}
    ]}"#;
    let mut envoy = Envoy::start_with(
        &host,
        &sluice_e2e::filter_wasm(),
        EnvoyConfig::new(policy, ["sluice".to_owned()]),
        0,
    )
    .unwrap();
    envoy.started();
    let allowed = envoy_stat(&envoy, "sluice.rule.r.allowed");

    // The request arrives just after a tick, so its increments wait the longest.
    let mut now = 0;
    tick_until(&mut envoy, &mut now, SECOND_NS);
    let arrival = now + 1_000_000;
    let request = Request {
        id: 1,
        headers: [
            (":path", "/"),
            (":method", "GET"),
            (":authority", "shop.example"),
            (":scheme", "http"),
        ]
        .map(|(k, v)| (k.to_owned(), v.as_bytes().to_vec()))
        .to_vec(),
        peer: ([192, 0, 2, 1].into(), 1234),
        upstream_status: 200,
        upstream_bytes: 0,
    };
    let sent = envoy.begin(0, request, arrival);
    let [Output::Callout { callout, .. }, Output::Paused { .. }] = sent.as_slice() else {
        panic!("expected one callout and the request paused, got {sent:?}");
    };
    let body = br#"{"results":[{"allowed":true,"limit":5,"remaining":4,"reset_ms":60000,"retry_after_ms":null,"delay_ms":0}]}"#;
    let reply = CalloutReply {
        headers: Some(HeaderMap::from_pairs([
            (":status", b"200".to_vec()),
            ("content-type", b"application/json".to_vec()),
        ])),
        body: Some(body.to_vec()),
        trailers: HeaderMap::default(),
    };
    let done = envoy.deliver(0, callout.token, reply, arrival);
    assert!(
        done.iter()
            .any(|o| matches!(o, Output::Completed(c) if c.status == 200)),
        "{done:?}"
    );

    tick_until(&mut envoy, &mut now, arrival + SECOND_NS);
    assert_eq!(envoy_stat(&envoy, "sluice.rule.r.allowed"), allowed + 1);
    assert_eq!(envoy_stat(&envoy, "sluice.callouts"), 1);
}

/// Fires worker 0's ticks as Envoy would, at the period the filter asks for, from `now` until
/// the last one at or before `until`.
fn tick_until(envoy: &mut Envoy, now: &mut u64, until: u64) {
    loop {
        let period = u64::from(envoy.tick_period_ms(0)) * 1_000_000;
        assert!(period > 0, "the filter stopped its tick");
        if *now + period > until {
            return;
        }
        *now += period;
        envoy.tick(0, *now);
    }
}
