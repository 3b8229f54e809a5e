//! Nothing a client or the service sends can trap the filter: arbitrary request headers
//! (non-UTF-8 values, odd paths, any address) and arbitrary callout answers (any status, any
//! body, no headers at all) go through the real .wasm in the simulator's host, and the VM must
//! survive every one and answer every request. Lease answers, scripted here, are held to what
//! was asked, and never bring back units the server no longer counts.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use sluice_e2e::probe::callouts;
use sluice_host::Host;
use sluice_host::envoy::{Envoy, EnvoyConfig, Output, Request};
use sluice_host::header_map::HeaderMap;
use sluice_host::state::CalloutReply;

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
        // Each verdict's limit one of the rules' capacities, so that many answers are possible
        // for the checks they answer and reach the decision, and some are refused.
        prop::collection::vec(
            (any::<bool>(), prop::sample::select(vec![10u64, 3, 5]), 0u64..=3, 0u64..5000, prop::option::of(0u64..5000), 0u64..3000),
            3,
        )
        .prop_map(|verdicts| {
            let results: Vec<serde_json::Value> = verdicts
                .into_iter()
                .map(|(allowed, limit, remaining, reset, retry, delay)| {
                    serde_json::json!({"allowed": allowed, "limit": limit, "remaining": remaining, "reset_ms": reset, "retry_after_ms": retry, "delay_ms": delay})
                })
                .collect();
            serde_json::to_vec(&serde_json::json!({ "results": results })).unwrap()
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

/// `GET path` from 192.0.2.1, request number `id`.
fn get(id: u64, path: &str) -> Request {
    Request {
        id,
        headers: vec![
            (":path".to_owned(), path.as_bytes().to_vec()),
            (":method".to_owned(), b"GET".to_vec()),
            (":authority".to_owned(), b"a.example".to_vec()),
            (":scheme".to_owned(), b"http".to_vec()),
        ],
        peer: ([192, 0, 2, 1].into(), 1234),
        upstream_status: 200,
        upstream_bytes: 0,
    }
}

/// A 200 answer with this body.
fn ok_reply(body: &[u8]) -> CalloutReply {
    CalloutReply {
        headers: Some(HeaderMap::from_pairs([(":status", b"200".to_vec())])),
        body: Some(body.to_vec()),
        trailers: HeaderMap::default(),
    }
}

/// Sends `request` and answers each callout it makes, as it goes out, with `body`. Returns
/// whether it called out, and its status once completed (`None`: still held).
fn exchange(envoy: &mut Envoy, request: Request, body: &[u8], now: u64) -> (bool, Option<u16>) {
    exchange_on(envoy, 0, request, body, now)
}

/// As [`exchange`], on `worker`.
fn exchange_on(
    envoy: &mut Envoy,
    worker: usize,
    request: Request,
    body: &[u8],
    now: u64,
) -> (bool, Option<u16>) {
    let mut outputs = envoy.begin(worker, request, now);
    let asked = callouts(&outputs);
    for callout in &asked {
        outputs.extend(envoy.deliver(worker, callout.token, ok_reply(body), now));
    }
    let status = outputs.iter().find_map(|o| match o {
        Output::Completed(done) => Some(done.status),
        _ => None,
    });
    (!asked.is_empty(), status)
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
    const LEASED: &str = r#"{"cluster": "sluice", "rules": [{"name": "r", "key": [{"const": "all"}],
        "limit": {"algorithm": "gcra", "rate": 1000, "per": "1s", "burst": 1000}, "lease": {"horizon": "100ms"}}]}"#;
    let allowed = br#"{"results":[{"allowed":true,"limit":1000,"remaining":900,"reset_ms":100,"retry_after_ms":null,"delay_ms":0}]}"#;
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
            !exchange(envoy, get(id, "/"), allowed, now).0
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
        envoy.deliver(0, ask.token, ok_reply(&body), now);
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

/// A verdict that no algorithm could give for its rule (another capacity, more remaining than
/// the limit holds, a hold past `max_wait`) is garbage however well formed: the filter refuses
/// the answer whole, logs why, and the failure mode decides. A denial claiming a longer wait
/// than its limit ever asks is passed on to the client, but the deny cache keeps it no longer
/// than the limit's longest wait: past that, the next request asks the service again.
#[test]
fn verdicts_impossible_for_their_rule_are_refused_and_cached_denials_are_bounded() {
    const POLICY: &str = r#"{"cluster": "sluice", "failure_mode": "deny", "rules": [
        {"name": "shape", "match": {"path": {"prefix": "/shape"}}, "key": [{"const": "all"}],
         "limit": {"algorithm": "leaky_bucket", "rate": 5, "per": "1s", "burst": 10, "mode": "shaping", "max_wait": "2s"}},
        {"name": "per-client", "match": {"path": {"prefix": "/gcra"}}, "key": ["client_ip"],
         "limit": {"algorithm": "gcra", "rate": 10, "per": "1s", "burst": 10}}]}"#;
    let verdict = |allowed: bool, limit: u64, remaining: u64, wait_ms: u64, delay_ms: u64| {
        format!(
            r#"{{"results":[{{"allowed":{allowed},"limit":{limit},"remaining":{remaining},"reset_ms":{wait_ms},"retry_after_ms":{wait_ms},"delay_ms":{delay_ms}}}]}}"#
        )
    };
    let host = Host::new().unwrap();
    let plugin = host.load(&sluice_e2e::filter_wasm()).unwrap();
    let mut envoy =
        Envoy::start(&plugin, EnvoyConfig::new(POLICY, ["sluice".to_owned()]), 0).unwrap();
    let mut id = 0;
    let mut send = |envoy: &mut Envoy, path: &str, body: String, now: u64| {
        id += 1;
        exchange(envoy, get(id, path), body.as_bytes(), now)
    };
    let refused = |envoy: &Envoy, what: &str| {
        envoy.logs().recent().iter().any(|l| {
            l.message
                .contains(&format!("response body: results[0].{what}"))
        })
    };
    let mut now = 1_000_000_000_000u64;

    for (body, why) in [
        (
            verdict(true, 10, 0, 0, 2001),
            "delay_ms is 2001, longer than the rule's max_wait (2000 ms)",
        ),
        (
            verdict(true, 10, 11, 0, 0),
            "remaining is 11, more than the rule's limit of 10",
        ),
        (verdict(true, 9, 0, 0, 0), "limit is 9, not the rule's 10"),
    ] {
        // A second apart: a worker writes such a warning once a second.
        now += 1_100_000_000;
        assert_eq!(
            send(&mut envoy, "/shape", body, now),
            (true, Some(503)),
            "{why}"
        );
        assert!(refused(&envoy, why), "not logged: {why}");
    }
    // The control: a hold of exactly max_wait is obeyed.
    now += 1_000_000;
    assert_eq!(
        send(&mut envoy, "/shape", verdict(true, 10, 0, 0, 2000), now),
        (true, None)
    );

    // A denial for a billion milliseconds; gcra at 10/s with a burst of 10 never asks for
    // more than two fills of its bucket, 2 s.
    let denial = verdict(false, 10, 0, 1_000_000_000, 0);
    let start = now + 1_000_000;
    assert_eq!(
        send(&mut envoy, "/gcra", denial.clone(), start),
        (true, Some(429))
    );
    let cached = send(&mut envoy, "/gcra", denial.clone(), start + 1_990_000_000);
    assert_eq!(
        cached,
        (false, Some(429)),
        "denied from the cache within 2 s"
    );
    let asked_again = send(&mut envoy, "/gcra", denial, start + 2_010_000_000);
    assert_eq!(
        asked_again,
        (true, Some(429)),
        "asked the service again after 2 s"
    );
    assert!(envoy.failed(0).is_none());
}

/// A key leased on one Envoy by scripted answers: the Envoy, the time (ns), how many requests
/// it has sent, and the units of its first lease.
struct Leased {
    envoy: Envoy,
    now: u64,
    sent: u64,
    first_grant: u64,
}

const MS_NS: u64 = 1_000_000;
const LEASE_TTL_MS: u64 = 1_000;
/// One rule leasing one key, on a lease of `LEASE_TTL_MS`.
const LEASE_POLICY: &str = r#"{"cluster": "sluice", "rules": [{"name": "r", "key": [{"const": "all"}],
    "limit": {"algorithm": "gcra", "rate": 1000, "per": "1s", "burst": 1000},
    "lease": {"horizon": "100ms", "ttl": "1s"}}]}"#;
const ALLOWED: &[u8] = br#"{"results":[{"allowed":true,"limit":1000,"remaining":900,"reset_ms":100,"retry_after_ms":null,"delay_ms":0}]}"#;

impl Leased {
    /// Makes the key busy by callout, then grants the first lease ask in full.
    fn start(plugin: &sluice_host::Plugin) -> Leased {
        let envoy = Envoy::start(
            plugin,
            EnvoyConfig::new(LEASE_POLICY, ["sluice".to_owned()]),
            0,
        )
        .unwrap();
        let mut leased = Leased {
            envoy,
            now: 1_000_000 * MS_NS,
            sent: 0,
            first_grant: 0,
        };
        for _ in 0..50 {
            leased.now += MS_NS;
            assert!(!leased.send(), "decided in Envoy before any lease");
        }
        leased.first_grant = leased.answer_asks(|ask| (ask.want, None));
        assert!(leased.first_grant > 10, "{}", leased.first_grant);
        leased
    }

    /// Sends one request, answering its callout with an admission; whether it was decided
    /// in Envoy.
    fn send(&mut self) -> bool {
        self.sent += 1;
        !exchange(&mut self.envoy, get(self.sent, "/"), ALLOWED, self.now).0
    }

    /// Ticks every 5 ms until the tick sends a lease call, and answers each of its asks with
    /// what `grant` makes of it (units granted, units kept); the units granted in all.
    fn answer_asks(
        &mut self,
        mut grant: impl FnMut(&sluice_core::wire::LeaseAsk) -> (u64, Option<u64>),
    ) -> u64 {
        for _ in 0..40 {
            self.now += 5 * MS_NS;
            let calls = callouts(&self.envoy.tick(0, self.now));
            let [call] = calls.as_slice() else {
                continue;
            };
            let request = sluice_core::wire::LeaseRequest::from_json(&call.body).unwrap();
            let mut total = 0;
            let grants: Vec<serde_json::Value> = request
                .asks
                .iter()
                .map(|ask| {
                    let (granted, kept) = grant(ask);
                    total += granted;
                    serde_json::json!({"granted": granted, "lease_ms": LEASE_TTL_MS,
                        "limit": 1000, "remaining": 500, "kept": kept})
                })
                .collect();
            let body = serde_json::to_vec(&serde_json::json!({ "grants": grants })).unwrap();
            self.envoy.deliver(0, call.token, ok_reply(&body), self.now);
            return total;
        }
        panic!("no lease call in 200 ms")
    }

    /// Requests at this instant until one is not decided in Envoy: how many were.
    fn spend_all(&mut self) -> u64 {
        let mut local = 0;
        while self.send() {
            local += 1;
            assert!(local < 10_000, "units without end");
        }
        local
    }
}

/// A new lease covers only the units the server counts. Units left when a lease ended (its
/// renewals failed) are not brought back by the next grant, whose ask said none were held;
/// and a renewal the server answers with what it kept of the units held (it came after the
/// lease had ended there) leaves the Envoy no more than that.
#[test]
fn a_new_lease_brings_back_no_unit_the_server_no_longer_counts() {
    let host = Host::new().unwrap();
    let plugin = host.load(&sluice_e2e::filter_wasm()).unwrap();

    let mut lapsed = Leased::start(&plugin);
    let lease_ends = lapsed.now + LEASE_TTL_MS * MS_NS;
    // A request every 50 ms keeps the key in use, every lease call fails, and the lease ends
    // with units unspent.
    let failed = CalloutReply {
        headers: Some(HeaderMap::from_pairs([(":status", b"503".to_vec())])),
        body: None,
        trailers: HeaderMap::default(),
    };
    let mut local_before_end = 0;
    while lapsed.now < lease_ends + 100 * MS_NS {
        lapsed.now += 50 * MS_NS;
        local_before_end += u64::from(lapsed.send());
        for call in callouts(&lapsed.envoy.tick(0, lapsed.now)) {
            lapsed
                .envoy
                .deliver(0, call.token, failed.clone(), lapsed.now);
        }
    }
    assert!(
        local_before_end >= 15,
        "spent from the lease: {local_before_end}"
    );
    assert!(!lapsed.send(), "the lease ended");
    let mut held_said = None;
    let granted = lapsed.answer_asks(|ask| {
        held_said = Some(ask.held);
        (ask.want.min(4), None)
    });
    assert_eq!(held_said, Some(0), "the ask says nothing is held");
    assert_eq!(lapsed.spend_all(), granted, "only the new grant is spent");

    let mut late = Leased::start(&plugin);
    // Past half the lease's units a request marks the key as asked for, and the next lease
    // call is answered as one that reached the server after the lease had ended there: none
    // of the units held were kept.
    for _ in 0..=late.first_grant / 2 {
        assert!(late.send());
    }
    let mut held_said = 0;
    let granted = late.answer_asks(|ask| {
        held_said = ask.held;
        (0, Some(0))
    });
    assert_eq!(granted, 0);
    assert!(held_said > 10, "the Envoy held {held_said}");
    assert_eq!(late.spend_all(), 0, "none of the units held are spent");
}

/// A worker that marked a key as asked for and then stalled (its tick did not run for a whole
/// lease ttl, so its mark counts as lost) does not send its ask once another worker has marked
/// and sent its own: two asks of one holder for one key, both saying 0 held, would make the
/// server's ledger count only the second grant while the Envoy spends both.
#[test]
fn a_stalled_worker_does_not_ask_beside_the_worker_that_asked_since() {
    let host = Host::new().unwrap();
    let plugin = host.load(&sluice_e2e::filter_wasm()).unwrap();
    let config = EnvoyConfig {
        workers: 2,
        ..EnvoyConfig::new(LEASE_POLICY, ["sluice".to_owned()])
    };
    let mut envoy = Envoy::start(&plugin, config, 0).unwrap();
    let mut id = 0;
    let mut send = |envoy: &mut Envoy, worker: usize, now: u64| {
        id += 1;
        exchange_on(envoy, worker, get(id, "/"), ALLOWED, now);
    };
    let mut now = 1_000_000 * MS_NS;
    // Worker 0's requests make the key busy, and one of them marks it as asked for; its tick
    // does not run.
    for _ in 0..10 {
        now += MS_NS;
        send(&mut envoy, 0, now);
    }
    // A whole ttl later worker 1 marks it again, and its tick sends the ask.
    now += (LEASE_TTL_MS + 100) * MS_NS;
    for _ in 0..10 {
        now += MS_NS;
        send(&mut envoy, 1, now);
    }
    now += 5 * MS_NS;
    let asks_of = |calls: Vec<sluice_host::state::OutgoingCallout>| -> usize {
        calls
            .iter()
            .map(|c| {
                sluice_core::wire::LeaseRequest::from_json(&c.body)
                    .unwrap()
                    .asks
                    .iter()
                    .filter(|a| a.want > 0)
                    .count()
            })
            .sum()
    };
    assert_eq!(asks_of(callouts(&envoy.tick(1, now))), 1, "worker 1 asks");
    assert_eq!(
        asks_of(callouts(&envoy.tick(0, now))),
        0,
        "worker 0's mark is no longer the one in force"
    );
}
