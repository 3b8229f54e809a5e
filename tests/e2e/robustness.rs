//! Nothing a client or the service sends can trap the filter: arbitrary request headers
//! (non-UTF-8 values, odd paths, any address) and arbitrary callout answers (any status, any
//! body, no headers at all) go through the real .wasm in the simulator's host, and the VM must
//! survive every one and answer every request.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a broken expectation is a failed test

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use sluice_sim::envoy::{Envoy, EnvoyConfig, Output, Request};
use sluice_sim::host::Host;
use sluice_sim::host::headers::HeaderMap;
use sluice_sim::host::state::CalloutReply;

/// Every matcher and key part, so every code path reads the request.
const POLICY: &str = r#"{"cluster": "sluice", "trusted_hops": 1, "response": {"headers": "ietf", "on_allowed": true},
  "rules": [
    {"name": "a", "match": {"path": {"regex": "/api/.*"}, "method": ["GET", "POST"], "host": {"suffix": ".example"},
                            "headers": [{"name": "x-plan", "exact": "free"}]},
     "key": ["client_ip", {"header": "x-api-key", "default": "anon"}, {"query": "tenant"}, "path", "method", "host"],
     "limit": {"algorithm": "gcra", "rate": 10, "per": "1s", "burst": 10}},
    {"name": "b", "key": [{"header": "x-api-key"}], "shadow": true,
     "limit": {"algorithm": "leaky_bucket", "rate": 1, "per": "1s", "burst": 3, "mode": "shaping", "max_wait": "2s"}},
    {"name": "c", "key": [{"const": "all"}], "limit": {"algorithm": "sliding_log", "limit": 5, "window": "1m"}}
  ]}"#;

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        "[ -~]{0,40}".prop_map(String::into_bytes),
        Just(b"free".to_vec()),
        Just(b"/api/x?tenant=t".to_vec()),
    ]
}

fn answer() -> impl Strategy<Value = CalloutReply> {
    let body = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200),
        Just(br#"{"results":[{"allowed":false,"limit":1,"remaining":0,"reset_ms":1,"retry_after_ms":null,"delay_ms":0}]}"#.to_vec()),
        (any::<bool>(), 0u64..5000, prop::option::of(0u64..5000), 0u64..3000).prop_map(|(allowed, reset, retry, delay)| {
            let one = serde_json::json!({"allowed": allowed, "limit": 10, "remaining": 3, "reset_ms": reset, "retry_after_ms": retry, "delay_ms": delay});
            serde_json::to_vec(&serde_json::json!({"results": [one.clone(), one.clone(), one]})).unwrap()
        }),
    ];
    (
        prop::option::of(prop_oneof![
            Just("200"),
            Just("503"),
            Just("504"),
            Just("x"),
            Just("")
        ]),
        body,
    )
        .prop_map(|(status, body)| match status {
            None => CalloutReply {
                headers: None,
                body: None,
                trailers: HeaderMap::default(),
            },
            Some(status) => CalloutReply {
                headers: Some(HeaderMap::from_pairs([
                    (":status", status.as_bytes().to_vec()),
                    ("content-type", b"application/json".to_vec()),
                ])),
                body: Some(body),
                trailers: HeaderMap::default(),
            },
        })
}

#[test]
fn arbitrary_requests_and_answers_never_trap_the_filter() {
    let host = Host::new().unwrap();
    let plugin = host.load(&sluice_e2e::filter_wasm()).unwrap();
    let envoy = std::cell::RefCell::new(
        Envoy::start(&plugin, EnvoyConfig::new(POLICY, ["sluice".to_owned()]), 0).unwrap(),
    );
    let strategy = (
        bytes(),
        bytes(),
        bytes(),
        prop::collection::vec(
            (
                prop_oneof![
                    Just("x-api-key"),
                    Just("x-plan"),
                    Just("x-forwarded-for"),
                    Just("host")
                ],
                bytes(),
            ),
            0..6,
        ),
        any::<[u8; 4]>(),
        answer(),
    );
    let mut runner = TestRunner::new(Config {
        cases: 3000,
        failure_persistence: None,
        ..Config::default()
    });
    let clock = std::cell::Cell::new((1_000_000_000u64, 0u64));
    let result = runner.run(&strategy, |(path, method, authority, extra, ip, reply)| {
        let (now, id) = (clock.get().0 + 7_000_000, clock.get().1 + 1);
        clock.set((now, id));
        let mut envoy = envoy.borrow_mut();
        let mut headers = vec![
            (":path".to_owned(), path),
            (":method".to_owned(), method),
            (":authority".to_owned(), authority),
            (":scheme".to_owned(), b"http".to_vec()),
        ];
        headers.extend(extra.into_iter().map(|(k, v)| (k.to_owned(), v)));
        let request = Request {
            id,
            headers,
            peer: (ip.into(), 1234),
            upstream_status: 200,
            upstream_bytes: 0,
        };
        let mut outputs = envoy.begin(0, request, now);
        let mut completed = outputs.iter().any(|o| matches!(o, Output::Completed(_)));
        let tokens: Vec<u32> = outputs
            .iter()
            .filter_map(|o| {
                if let Output::Callout { callout, .. } = o {
                    Some(callout.token)
                } else {
                    None
                }
            })
            .collect();
        for token in tokens {
            outputs = envoy.deliver(0, token, reply.clone(), now);
            completed |= outputs.iter().any(|o| matches!(o, Output::Completed(_)));
            // A shaped request is released by the tick.
            for tick in 1..=500 {
                if completed {
                    break;
                }
                outputs = envoy.tick(0, now + tick * 5_000_000);
                completed |= outputs.iter().any(|o| matches!(o, Output::Completed(_)));
            }
        }
        prop_assert!(
            envoy.failed(0).is_none(),
            "the VM trapped: {:?}",
            envoy.failed(0)
        );
        prop_assert!(completed, "the request was never answered");
        Ok(())
    });
    if let Err(e) = result {
        let envoy = envoy.borrow();
        let logs: Vec<String> = envoy
            .logs()
            .recent()
            .into_iter()
            .rev()
            .take(5)
            .map(|l| l.message)
            .collect();
        panic!("{e}\nlast logs: {logs:?}");
    }
}

/// How a lease answer oversteps its ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Overstep {
    /// It does not: the control.
    Nothing,
    /// One unit more than wanted.
    Units,
    /// A lease a millisecond longer than the terms' ttl.
    Lease,
}

/// A lease answer granting more than was asked, or a longer lease than the terms allow, would
/// break the bound the terms promise: the filter refuses it whole, logs why, and keeps deciding
/// by callout. The same answer within the ask lets the next request be decided in Envoy.
#[test]
fn a_lease_answer_beyond_its_ask_is_refused_and_its_units_never_spent() {
    use sluice_core::wire::{LEASE_PATH, LeaseRequest};
    use sluice_e2e::probe::callouts;
    const LEASED: &str = r#"{"cluster": "sluice", "rules": [{"name": "r", "key": [{"const": "all"}],
        "limit": {"algorithm": "gcra", "rate": 1000, "per": "1s", "burst": 1000}, "lease": {"horizon": "100ms"}}]}"#;
    let allowed = br#"{"results":[{"allowed":true,"limit":1000,"remaining":900,"reset_ms":100,"retry_after_ms":null,"delay_ms":0}]}"#;
    let reply = |body: Vec<u8>| CalloutReply {
        headers: Some(HeaderMap::from_pairs([(":status", b"200".to_vec())])),
        body: Some(body),
        trailers: HeaderMap::default(),
    };
    let host = Host::new().unwrap();
    let plugin = host.load(&sluice_e2e::filter_wasm()).unwrap();
    for overstep in [Overstep::Nothing, Overstep::Units, Overstep::Lease] {
        let mut envoy =
            Envoy::start(&plugin, EnvoyConfig::new(LEASED, ["sluice".to_owned()]), 0).unwrap();
        let mut id = 0;
        // Requests one after another, each answered by callout as it goes out; returns
        // whether the last was decided in Envoy (completed without a callout).
        let mut send = |envoy: &mut Envoy, now: u64| -> bool {
            id += 1;
            let request = Request {
                id,
                headers: vec![
                    (":path".to_owned(), b"/".to_vec()),
                    (":method".to_owned(), b"GET".to_vec()),
                    (":authority".to_owned(), b"a.example".to_vec()),
                    (":scheme".to_owned(), b"http".to_vec()),
                ],
                peer: ([192, 0, 2, 1].into(), 1234),
                upstream_status: 200,
                upstream_bytes: 0,
            };
            let outputs = envoy.begin(0, request, now);
            let asked = callouts(&outputs);
            for callout in &asked {
                envoy.deliver(0, callout.token, reply(allowed.to_vec()), now);
            }
            asked.is_empty()
        };
        let mut now = 1_000_000_000_000u64;
        for _ in 0..50 {
            now += 1_000_000;
            assert!(!send(&mut envoy, now), "decided in Envoy before any lease");
        }
        // The key is busy: a tick sends the lease ask.
        let mut asks = Vec::new();
        for _ in 0..20 {
            now += 5_000_000;
            asks = callouts(&envoy.tick(0, now));
            if !asks.is_empty() {
                break;
            }
        }
        let [ask] = asks.as_slice() else {
            panic!("one lease call expected, got {}", asks.len())
        };
        let path = ask.headers.iter().find(|(k, _)| k == ":path").unwrap();
        assert_eq!(path.1, LEASE_PATH.as_bytes());
        let request = LeaseRequest::from_json(&ask.body).unwrap();
        let grants: Vec<serde_json::Value> = request
            .asks
            .iter()
            .map(|a| {
                serde_json::json!({
                    "granted": a.want + u64::from(overstep == Overstep::Units),
                    "lease_ms": a.terms.ttl.as_millis() + u64::from(overstep == Overstep::Lease),
                    "limit": 1000,
                    "remaining": 500,
                })
            })
            .collect();
        let body = serde_json::to_vec(&serde_json::json!({ "grants": grants })).unwrap();
        envoy.deliver(0, ask.token, reply(body), now);
        now += 1_000_000;
        let local = send(&mut envoy, now);
        assert_eq!(local, overstep == Overstep::Nothing, "{overstep:?}");
        let refused = envoy.logs().recent().iter().any(|l| {
            l.message
                .contains("lease call failed: response body: grants[0]")
        });
        assert_eq!(refused, overstep != Overstep::Nothing, "{overstep:?}");
        assert!(envoy.failed(0).is_none());
    }
}
