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
