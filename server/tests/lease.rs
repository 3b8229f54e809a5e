//! Leases on a real redis-server: granted out of the very state a per-request decision uses,
//! never more than the algorithm admits at that instant, within each holder's and each key's
//! cap; units given back go to the next grant; a lease ends with its ttl.

use crate::common;

use std::sync::Arc;

use common::{Http, server};
use sluice_core::limit::{Algorithm, Limit};
use sluice_core::wire::{DecideRequest, LeaseAsk, LeaseGrant, LeaseRequest};
use sluice_harness::{RedisCluster, RedisServer};
use sluice_server::engine::{Engine, LeaseError};
use sluice_server::metrics::Metrics;
use sluice_server::store::Topology;

const NOW: i64 = 1_763_700_000_000_000;

/// A limit of 20 for each algorithm that can be leased, with refills too slow to matter.
fn twenty(algorithm: Algorithm) -> String {
    match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow => {
            format!(r#"{{"algorithm":"{algorithm}","limit":20,"window":"1h"}}"#)
        }
        _ => format!(r#"{{"algorithm":"{algorithm}","rate":1,"per":"1h","burst":20}}"#),
    }
}

struct Keys {
    engine: Engine,
    limit: String,
}

impl Keys {
    async fn new(topology: Topology, limit: String) -> Keys {
        let store = common::connected_store(topology).await;
        Keys {
            engine: Engine::new(store, "lease".to_owned(), Arc::new(Metrics::default())),
            limit,
        }
    }

    /// One ask of `holder` for key `k` at `now`.
    async fn ask(
        &self,
        holder: &str,
        now: i64,
        (want, held, returning): (u64, u64, u64),
    ) -> LeaseGrant {
        let body = format!(
            r#"{{"holder":"{holder}","asks":[{{"rule":"r","key":"k","limit":{},"terms":{{"max_units":8,"max_outstanding":12,"ttl":"1s"}},"want":{want},"held":{held},"returning":{returning}}}]}}"#,
            self.limit
        );
        let request = LeaseRequest::from_json(body.as_bytes()).unwrap();
        self.engine.lease(&request, Some(now)).await.unwrap().grants[0]
    }

    /// The grant of `request`'s first ask, asked `at_s` seconds after [`NOW`].
    async fn fund(&self, request: LeaseRequest, at_s: f64) -> LeaseGrant {
        self.engine
            .lease(&request, Some(NOW + (at_s * 1e6) as i64))
            .await
            .unwrap()
            .grants[0]
    }

    /// The error `request` is refused with at [`NOW`].
    async fn refusal(&self, request: &LeaseRequest) -> String {
        self.engine
            .lease(request, Some(NOW))
            .await
            .unwrap_err()
            .to_string()
    }

    /// What a per-request decision of `cost` says at `now` (cost 0: only asks).
    async fn decide(&self, now: i64, cost: u64) -> (bool, u64) {
        let body = format!(
            r#"{{"checks":[{{"rule":"r","key":"k","limit":{},"cost":{cost}}}]}}"#,
            self.limit
        );
        let request = DecideRequest::from_json(body.as_bytes()).unwrap();
        let verdict = self
            .engine
            .decide(&request, Some(now))
            .await
            .unwrap()
            .results[0];
        (verdict.allowed, verdict.remaining)
    }
}

async fn leases_come_out_of_the_request_state(topology: Topology) {
    for algorithm in Algorithm::ALL {
        let keys = Keys::new(topology.clone(), twenty(algorithm)).await;
        let _: Limit = serde_json::from_str(&keys.limit).unwrap();
        // Three holders take 8, 4 (the key's cap of 12 outstanding) and nothing.
        let a = keys.ask("a", NOW, (8, 0, 0)).await;
        assert_eq!(
            (a.granted, a.lease_ms, a.remaining),
            (8, 1000, 12),
            "{algorithm}"
        );
        assert_eq!(
            keys.decide(NOW, 0).await,
            (true, 12),
            "{algorithm}: the same state"
        );
        let b = keys.ask("b", NOW, (8, 0, 0)).await;
        assert_eq!(b.granted, 4, "{algorithm}: capped by max_outstanding");
        assert_eq!(
            b.more_in_ms, 0,
            "{algorithm}: held back by a cap, not empty"
        );
        let c = keys.ask("c", NOW, (8, 0, 0)).await;
        assert_eq!(c.granted, 0, "{algorithm}");
        // Per-request decisions take the rest of the algorithm's 20.
        for _ in 0..8 {
            assert!(keys.decide(NOW + 1, 1).await.0, "{algorithm}");
        }
        assert_eq!(keys.decide(NOW + 2, 1).await, (false, 0), "{algorithm}");
        // `a` gives back 5 and keeps 3: `c` is given those 5 from the pool, not from the
        // algorithm, which still admits nothing.
        let a = keys.ask("a", NOW + 3, (0, 3, 5)).await;
        assert_eq!(a.granted, 0, "{algorithm}");
        let c = keys.ask("c", NOW + 4, (8, 0, 0)).await;
        assert_eq!(c.granted, 5, "{algorithm}: the pool first");
        assert_eq!(keys.decide(NOW + 5, 1).await, (false, 0), "{algorithm}");
        // Nothing left anywhere: an empty answer that says when a unit will be admitted.
        let b = keys.ask("b", NOW + 6, (4, 4, 0)).await;
        assert_eq!(b.granted, 0, "{algorithm}");
        assert!(b.more_in_ms > 0, "{algorithm}: {b:?}");
        // After the ttl nothing `a`, `b` or `c` held counts any more: the caps are free, and a
        // grant takes only what the algorithm itself admits.
        let later = keys.ask("d", NOW + 2_000_000, (8, 0, 0)).await;
        assert_eq!(
            later.granted, 0,
            "{algorithm}: the algorithm has nothing: {later:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_come_out_of_the_state_a_request_uses_within_every_cap() {
    let redis = RedisServer::start().unwrap();
    leases_come_out_of_the_request_state(Topology::Standalone(redis.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_come_out_of_the_state_a_request_uses_within_every_cap_on_a_cluster() {
    let cluster = RedisCluster::start().unwrap();
    leases_come_out_of_the_request_state(Topology::Cluster(cluster.urls())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_never_keeps_more_than_the_ledger_says_it_holds() {
    let redis = RedisServer::start().unwrap();
    let keys = Keys::new(Topology::Standalone(redis.url()), twenty(Algorithm::Gcra)).await;
    assert_eq!(keys.ask("a", NOW, (3, 0, 0)).await.granted, 3);
    // `a` claims to hold 8 and to give back 8: the ledger knows of 3, so the pool gets 3, and
    // `b`, wanting 8 of a cap of 12, can have 3 from the pool and 9 more... capped by its own
    // max_units of 8.
    let a = keys.ask("a", NOW + 1, (0, 8, 8)).await;
    assert_eq!(a.kept, Some(0), "none held beyond the 3 it gave back");
    let b = keys.ask("b", NOW + 2, (8, 0, 0)).await;
    assert_eq!(b.granted, 8);
    assert_eq!(
        b.remaining, 12,
        "3 of b's 8 came from the pool, 5 from the algorithm (20 - 3 - 5)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lease_requests_get_400_naming_the_field() {
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |_| {}).await;
    let http = Http::http1();
    let ask = r#"{"rule":"r","key":"k","limit":{"algorithm":"gcra","rate":1,"per":"1s","burst":5},"terms":{"max_units":2,"max_outstanding":4,"ttl":"1s"}}"#;
    // The ask with more fields.
    let ask_with = |extra: &str| format!("{}{extra}}}", &ask[..ask.len() - 1]);
    for (body, expected) in [
        (r#"{"holder":"h"}"#.to_owned(), "body: missing field `asks`"),
        (
            format!(r#"{{"holder":"no spaces","asks":[{ask}]}}"#),
            "holder: `no spaces` is not a holder name",
        ),
        (
            format!(
                r#"{{"holder":"h","asks":[{}]}}"#,
                ask.replace(r#""ttl":"1s""#, r#""ttl":"2m""#)
            ),
            "asks[0]: `ttl` must be at most 1m",
        ),
        (
            format!(r#"{{"holder":"h","asks":[{}]}}"#, ask_with(r#","want":3"#)),
            "asks[0].want: must be at most terms.max_units (2), not 3",
        ),
    ] {
        let answer = http
            .send(
                "POST",
                &format!("{}/v1/lease", server.url()),
                &[("content-type", "application/json")],
                body.clone(),
            )
            .await;
        assert_eq!(answer.status, 400, "{body}: {}", answer.body);
        let message = answer.json()["error"].as_str().unwrap().to_owned();
        assert!(
            message.starts_with(expected),
            "{body}\n  got:  {message}\n  want: {expected}"
        );
    }
    let ok = http
        .send(
            "POST",
            &format!("{}/v1/lease", server.url()),
            &[("content-type", "application/json")],
            format!(r#"{{"holder":"h","asks":[{}]}}"#, ask_with(r#","want":2"#)),
        )
        .await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.json()["grants"][0]["granted"], 2);
    let metrics = http.get(&format!("{}/metrics", server.url())).await.body;
    assert!(
        metrics.contains(r#"sluice_lease_units_total{rule="r",kind="granted"} 2"#),
        "{metrics}"
    );
}

/// Holders whose demands add up to more than the limit's rate, once its burst is spent, are
/// each given their max-min fair share of it as a pace; within the rate, or while the burst
/// holds more, no pace: the algorithm itself would admit at the pace requests come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_over_the_rate_are_paced_at_their_fair_shares() {
    let redis = RedisServer::start().unwrap();
    let store = common::connected_store(Topology::Standalone(redis.url())).await;
    let engine = Engine::new(store, "pace".to_owned(), Arc::new(Metrics::default()));
    // 1,000 a second, each ask for 10 more units than `held`.
    let ask = |key: &str, burst: u64, holder: &str, (demand, held): (u64, u64), now: i64| {
        let body = format!(
            r#"{{"holder":"{holder}","asks":[{{"rule":"r","key":"{key}","limit":{{"algorithm":"gcra","rate":1000,"per":"1s","burst":{burst}}},"terms":{{"max_units":100,"max_outstanding":500,"ttl":"1s"}},"want":10,"held":{held},"demand":{demand}}}]}}"#
        );
        let request = LeaseRequest::from_json(body.as_bytes()).unwrap();
        let engine = &engine;
        async move { engine.lease(&request, Some(now)).await.unwrap().grants[0] }
    };
    // Key `spent` holds a burst of 20, which a's and b's first grants take.
    let spent = |holder, demand_held, now| ask("spent", 20, holder, demand_held, now);
    assert_eq!(
        spent("a", (400, 0), NOW).await.pace_us,
        0,
        "400 a second: within the rate"
    );
    assert_eq!(
        spent("b", (300, 0), NOW).await.pace_us,
        0,
        "700 in all: within the rate"
    );
    // a now asks for 900 a second: 1200 in all. b's 300 are met; a gets the other 700.
    assert_eq!(spent("a", (900, 10), NOW + 1).await.pace_us, 1_429);
    assert_eq!(spent("b", (300, 10), NOW + 2).await.pace_us, 3_334);
    // c joins at 900: b keeps 300, a and c share 700.
    assert_eq!(spent("c", (900, 0), NOW + 3).await.pace_us, 2_858);
    // Over the rate with most of a burst of 1,000 left: granted, not paced.
    let full = |holder, demand_held, now| ask("full", 1000, holder, demand_held, now);
    full("a", (900, 0), NOW).await;
    let grant = full("b", (900, 0), NOW + 1).await;
    assert_eq!((grant.granted, grant.pace_us), (10, 0), "{grant:?}");
}

/// One ask of `holder` for key `k` of a gcra limit of 20 (caps: 8 a holder, 12 in all), on
/// a lease of `ttl`, on Redis' own clock (a replay's keys live at least an hour, whatever
/// their ttl).
async fn ask_now(engine: &Engine, holder: &str, ttl: &str, (want, held): (u64, u64)) -> LeaseGrant {
    let body = format!(
        r#"{{"holder":"{holder}","asks":[{{"rule":"r","key":"k","limit":{},"terms":{{"max_units":8,"max_outstanding":12,"ttl":"{ttl}"}},"want":{want},"held":{held}}}]}}"#,
        twenty(Algorithm::Gcra)
    );
    let request = LeaseRequest::from_json(body.as_bytes()).unwrap();
    engine.lease(&request, None).await.unwrap().grants[0]
}

/// Holders may lease one key on different terms (a fleet part-way through a rollout that
/// changes the ttl): a holder with a short lease must not make the ledger forget, when it
/// lapses, what a holder with a long one still holds, or the key's cap on what is outstanding
/// would no longer count those units.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_does_not_end_the_ledger_of_a_long_one() {
    let redis = RedisServer::start().unwrap();
    let store = common::connected_store(Topology::Standalone(redis.url())).await;
    let engine = Engine::new(store, "terms".to_owned(), Arc::new(Metrics::default()));
    let ask = |holder, ttl| ask_now(&engine, holder, ttl, (8, 0));
    assert_eq!(ask("long", "30s").await.granted, 8);
    assert_eq!(ask("short", "100ms").await.granted, 4, "the cap of 12");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // `short`'s 4 have lapsed, `long`'s 8 have not: 4 more may be outstanding.
    assert_eq!(ask("next", "30s").await.granted, 4);
}

/// A renewal that reaches the server after the holder's lease ended there: the ledger no
/// longer counts the units it says it holds, and the answer says how many it kept, so that
/// the holder does not spend them under the new lease, outside every cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_renewal_is_told_how_many_held_units_the_ledger_still_counts() {
    let redis = RedisServer::start().unwrap();
    let store = common::connected_store(Topology::Standalone(redis.url())).await;
    let metrics = Arc::new(Metrics::default());
    let engine = Engine::new(store, "late".to_owned(), metrics.clone());
    let ask = |holder, want, held| ask_now(&engine, holder, "100ms", (want, held));
    let a = ask("a", 8, 0).await;
    assert_eq!((a.granted, a.kept), (8, None));
    assert_eq!(ask("a", 0, 8).await.kept, None, "renewed in time: all kept");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let late = ask("a", 4, 8).await;
    assert_eq!((late.granted, late.kept), (4, Some(0)));
    // The ledger counts only a's new 4: b may have 8 of the cap of 12.
    assert_eq!(ask("b", 8, 0).await.granted, 8);
    let text = metrics.render();
    assert!(
        text.contains(r#"sluice_lease_units_total{rule="r",kind="lapsed"} 8"#),
        "{text}"
    );
}

/// One ask of `holder` with `secret` for key `k` of a gcra limit of 100 (50 a holder and in
/// all, a lease of 1 s), at `now`.
fn secret_ask(
    holder: &str,
    secret: &str,
    (want, held, returning): (u64, u64, u64),
) -> LeaseRequest {
    let body = format!(
        r#"{{"holder":"{holder}","secret":"{secret}","asks":[{{"rule":"r","key":"k","limit":{{"algorithm":"gcra","rate":1,"per":"1h","burst":100}},"terms":{{"max_units":50,"max_outstanding":50,"ttl":"1s"}},"want":{want},"held":{held},"returning":{returning}}}]}}"#
    );
    LeaseRequest::from_json(body.as_bytes()).unwrap()
}

/// Holder names are not secret; what a holder holds can be given back or disowned only with
/// the secret its first ask bound, so no caller can spend a holder's units twice or lift the
/// key's cap on what is outstanding.
async fn only_a_holders_secret_acts_for_it(topology: Topology) {
    let store = common::connected_store(topology).await;
    let metrics = Arc::new(Metrics::default());
    let engine = Engine::new(store, "secret".to_owned(), Arc::clone(&metrics));
    let grant = |request: LeaseRequest, now: i64| {
        let engine = &engine;
        async move { engine.lease(&request, Some(now)).await }
    };
    let taken = grant(secret_ask("a", "sa", (50, 0, 0)), NOW).await.unwrap();
    assert_eq!(taken.grants[0].granted, 50);

    // The two attacks found: give a's units back in its name (for b to take them again while
    // a spends them), and re-register a as holding nothing (for c to take 50 more).
    for (secret, ask) in [("x", (0, 0, 50)), ("", (0, 0, 50)), ("x", (0, 0, 0))] {
        let refused = grant(secret_ask("a", secret, ask), NOW + 1).await;
        assert!(
            matches!(refused, Err(LeaseError::Stranger { ask: 0, .. })),
            "a stranger acted for a: {refused:?}"
        );
    }
    let b = grant(secret_ask("b", "sb", (50, 0, 0)), NOW + 2)
        .await
        .unwrap();
    assert_eq!(
        b.grants[0].granted, 0,
        "a still holds all 50 the key may have outstanding"
    );

    // a itself gives back 20, which b may then take.
    let a = grant(secret_ask("a", "sa", (0, 30, 20)), NOW + 3)
        .await
        .unwrap();
    assert_eq!(
        a.grants[0].kept, None,
        "the ledger counted all a said it held"
    );
    let b = grant(secret_ask("b", "sb", (50, 0, 0)), NOW + 4)
        .await
        .unwrap();
    assert_eq!(b.grants[0].granted, 20);

    // Once a's lease has ended, its name is free to bind again.
    let later = NOW + 2_000_000;
    let reused = grant(secret_ask("a", "new", (10, 0, 0)), later)
        .await
        .unwrap();
    assert_eq!(reused.grants[0].granted, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_holders_secret_acts_for_it_on_one_redis() {
    let redis = RedisServer::start().unwrap();
    only_a_holders_secret_acts_for_it(Topology::Standalone(redis.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_holders_secret_acts_for_it_on_a_cluster() {
    let cluster = RedisCluster::start().unwrap();
    only_a_holders_secret_acts_for_it(Topology::Cluster(cluster.urls())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_gets_409_naming_the_ask_and_is_counted() {
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |_| {}).await;
    let http = Http::http1();
    let lease = |body: String| {
        let http = &http;
        let url = format!("{}/v1/lease", server.url());
        async move {
            http.send("POST", &url, &[("content-type", "application/json")], body)
                .await
        }
    };
    let ask = r#"{"rule":"r","key":"k","limit":{"algorithm":"gcra","rate":1,"per":"1s","burst":5},"terms":{"max_units":2,"max_outstanding":4,"ttl":"10s"},"want":2}"#;
    let first = lease(format!(r#"{{"holder":"h","secret":"s1","asks":[{ask}]}}"#)).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let other = ask.replace(r#""key":"k""#, r#""key":"k2""#);
    let stranger = lease(format!(
        r#"{{"holder":"h","secret":"s2","asks":[{other},{ask}]}}"#
    ))
    .await;
    assert_eq!(stranger.status, 409, "{}", stranger.body);
    assert_eq!(
        stranger.json()["error"],
        "asks[1]: holder `h` holds this key's lease under another secret: send the secret its first ask sent, or take another holder name"
    );
    let bad = lease(format!(
        r#"{{"holder":"h","secret":"not a secret","asks":[{ask}]}}"#
    ))
    .await;
    assert_eq!(bad.status, 400);
    assert_eq!(
        bad.json()["error"],
        "secret: must be at most 64 of A-Z a-z 0-9 _ -"
    );
    let metrics = http.get(&format!("{}/metrics", server.url())).await.body;
    assert!(
        metrics.contains("sluice_lease_strangers_total 1"),
        "{metrics}"
    );
    // Nothing of the refused request was written: k2 was never leased.
    let k2 = common::state_key(
        "r",
        "k2",
        r#"{"algorithm":"gcra","rate":1,"per":"1s","burst":5}"#,
    );
    let exists: u64 = redis::cmd("EXISTS")
        .arg(&k2)
        .query(
            &mut redis::Client::open(redis.url())
                .unwrap()
                .get_connection()
                .unwrap(),
        )
        .unwrap();
    assert_eq!(exists, 0);
}

/// A ledger of another shape (a hash, as sluice once kept it under another name, or a string
/// it never wrote) fails the lease naming the ledger, and leaves the ledger and the state as
/// they were: the script never guesses what a foreign value means.
/// A ledger key of another shape than the lease script writes (a sliding window's ledger has
/// a key of its own) is an error that names it, and the call writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_of_another_shape_is_an_error_that_names_it() {
    let redis = RedisServer::start().unwrap();
    let keys = Keys::new(
        Topology::Standalone(redis.url()),
        twenty(Algorithm::SlidingWindow),
    )
    .await;
    let request = one_ask(&keys.limit);
    let ask = &request.asks[0];
    let state = sluice_core::key::redis_key("lease", &ask.rule, &ask.key, &ask.limit);
    let ledger = sluice_core::key::ledger_key(&state);
    for (foreign, expected) in [
        (
            vec!["SET", &ledger, "a=8"],
            format!(r#"ledger {ledger} holds "a=8""#),
        ),
        (vec!["HSET", &ledger, "a", "8:1:0:"], "WRONGTYPE".to_owned()),
    ] {
        redis.cli(&["DEL", &ledger]).unwrap();
        redis.cli(&foreign).unwrap();
        let error = keys.refusal(&request).await;
        assert!(error.contains(&expected), "{foreign:?}: {error}");
        assert_eq!(
            redis.cli(&["EXISTS", &state]).unwrap().trim(),
            "0",
            "{foreign:?}: nothing granted"
        );
    }
    assert_eq!(
        redis.cli(&["HGET", &ledger, "a"]).unwrap().trim(),
        "8:1:0:",
        "left as it was"
    );
}

/// A schedule's key (here a gcra's) keeps its ledger after its time: a ledger there of another
/// shape, or a key of another type, is an error that names the key, and the call writes
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedules_ledger_of_another_shape_is_an_error_that_names_its_key() {
    let redis = RedisServer::start().unwrap();
    let keys = Keys::new(Topology::Standalone(redis.url()), twenty(Algorithm::Gcra)).await;
    let request = one_ask(&keys.limit);
    let ask = &request.asks[0];
    let state = sluice_core::key::redis_key("lease", &ask.rule, &ask.key, &ask.limit);
    for (foreign, expected) in [
        (
            vec!["SET", &state, "17 a=8"],
            format!(r#"ledger in {state} holds "a=8""#),
        ),
        (
            vec!["SET", &state, "17:x a=8:1:0:"],
            format!(r#"key {state} holds "17:x""#),
        ),
        (vec!["HSET", &state, "a", "8:1:0:"], "WRONGTYPE".to_owned()),
    ] {
        redis.cli(&["DEL", &state]).unwrap();
        redis.cli(&foreign).unwrap();
        let error = keys.refusal(&request).await;
        assert!(error.contains(&expected), "{foreign:?}: {error}");
        if foreign[0] == "SET" {
            assert_eq!(
                redis.cli(&["GET", &state]).unwrap().trim(),
                foreign[2],
                "{foreign:?}: left as it was"
            );
        }
    }
    assert_eq!(
        redis.cli(&["HGET", &state, "a"]).unwrap().trim(),
        "8:1:0:",
        "left as it was"
    );
}

/// One ask of holder `a` for 8 units of `limit`.
fn one_ask(limit: &str) -> LeaseRequest {
    let body = format!(
        r#"{{"holder":"a","asks":[{{"rule":"r","key":"k","limit":{limit},"terms":{{"max_units":8,"max_outstanding":12,"ttl":"1s"}},"want":8,"held":0,"returning":0}}]}}"#
    );
    LeaseRequest::from_json(body.as_bytes()).unwrap()
}

/// A quota stream's funding (as sluice-server's own makes it): `holder` asks for its share of
/// `limit` over a second, by `demand` units a second.
fn share_ask(limit: &str, holder: &str, demand: u64) -> LeaseRequest {
    let body = format!(
        r#"{{"holder":"{holder}","asks":[{{"rule":"r","key":"k","limit":{limit},"terms":{{"max_units":1000000000,"max_outstanding":1000000000,"ttl":"10s"}},"want":1000000000,"demand":{demand},"share_span_ms":1000}}]}}"#
    );
    LeaseRequest::from_json(body.as_bytes()).unwrap()
}

/// A quota stream's funding (an ask with a span) leaves its ledger entry as it is while the
/// entry would say the same and lives half its ttl on: a busy bucket's funding then writes
/// the algorithm's time in its key. Its claim still counts in every other holder's share, and a
/// changed demand is written at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_funding_that_changes_nothing_in_the_ledger_does_not_rewrite_it() {
    let redis = RedisServer::start().unwrap();
    let limit = r#"{"algorithm":"gcra","rate":10,"per":"1s","burst":20}"#;
    let keys = Keys::new(Topology::Standalone(redis.url()), limit.to_owned()).await;
    let request = |holder: &str, demand: u64| share_ask(limit, holder, demand);
    let ask = &request("a", 10).asks[0];
    let state = sluice_core::key::redis_key("lease", &ask.rule, &ask.key, &ask.limit);
    let fund = |holder: &str, demand: u64, at_s: f64| keys.fund(request(holder, demand), at_s);
    // The ledger, after the gcra's time in its key.
    let stored = || {
        let value = redis.cli(&["GET", &state]).unwrap();
        let (_, ledger) = value.trim().split_once(' ').expect("a ledger in the key");
        ledger.to_owned()
    };
    fund("a", 10, 0.0).await;
    let first = stored();
    assert!(first.starts_with("a="), "{first}");
    for at_s in [1.0, 2.0, 3.0, 4.0, 5.0] {
        assert_eq!(fund("a", 10, at_s).await.granted, 10, "{at_s} s");
        assert_eq!(stored(), first, "{at_s} s: the same entry, half its ttl on");
    }
    fund("a", 10, 5.5).await;
    let renewed = stored();
    assert_ne!(renewed, first, "under half its ttl left: renewed");
    let b = fund("b", 10, 6.0).await;
    assert_eq!(
        b.share_per_ks, 5_000,
        "a's claim counts: half the rate each"
    );
    fund("a", 4, 6.5).await;
    assert!(
        stored().contains(":4000:"),
        "a changed demand is written at once: {}",
        stored()
    );
}

/// Quota streams whose shares add up to the whole rate find the algorithm at its edge every
/// span: with a burst of one span's rate, the units a funding takes are those made up since the
/// last, so a funding a moment early found one short (and the Envoy a unit less every other
/// second). Asked ahead of the span, each gets its whole share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_sharing_the_whole_rate_get_their_shares_though_a_funding_comes_early() {
    let redis = RedisServer::start().unwrap();
    let limit = r#"{"algorithm":"gcra","rate":10,"per":"1s","burst":10}"#;
    let keys = Keys::new(Topology::Standalone(redis.url()), limit.to_owned()).await;
    let fund = |holder: &str, at_us: i64| {
        let request = share_ask(limit, holder, 10);
        let engine = &keys.engine;
        async move {
            engine
                .lease(&request, Some(NOW + at_us))
                .await
                .unwrap()
                .grants[0]
                .granted
        }
    };
    fund("a", 0).await;
    fund("b", 0).await;
    let mut b_got = Vec::new();
    for k in 1..=20 {
        // Each second's fundings 1 ms early, by turns a little earlier still.
        let at = k * 1_000_000 - 1_000 - (k % 3) * 700;
        assert_eq!(fund("a", at).await, 5, "a at {k} s");
        b_got.push(fund("b", at + 200).await);
    }
    // (The first round follows a's first funding, which took the whole burst.)
    assert!(
        b_got[1..].iter().all(|&g| g == 5),
        "b was granted {b_got:?}"
    );
}

/// A busy server's fundings come late by turns, a few hundred milliseconds: a funding that
/// follows a late one by less than a span finds the algorithm short of what the late one
/// left, unless it reaches ahead by as much.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_funding_on_time_after_a_late_one_still_gets_the_whole_share() {
    let redis = RedisServer::start().unwrap();
    let limit = r#"{"algorithm":"gcra","rate":10,"per":"1s","burst":10}"#;
    let keys = Keys::new(Topology::Standalone(redis.url()), limit.to_owned()).await;
    let request = share_ask(limit, "a", 10);
    let mut got = Vec::new();
    for k in 0..=20 {
        let late_s = if k % 2 == 1 { 0.4 } else { 0.0 };
        got.push(
            keys.fund(request.clone(), f64::from(k) + late_s)
                .await
                .granted,
        );
    }
    assert!(got.iter().all(|&g| g == 10), "granted {got:?}");
}

/// A key's ledger names at most an ask's `max_holders`: a further holder is crowded out,
/// granted nothing, claims no share, and is told when the first entry ends; the ledger and the
/// algorithm's state are left as they were, and the holders it names are funded as before.
/// Once an entry ends, a crowded holder gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_full_of_holders_crowds_out_a_new_one_until_one_leaves() {
    let redis = RedisServer::start().unwrap();
    let limit = r#"{"algorithm":"gcra","rate":10,"per":"1s","burst":20}"#;
    let keys = Keys::new(Topology::Standalone(redis.url()), limit.to_owned()).await;
    let capped = |holder: &str| {
        let mut request = share_ask(limit, holder, 10);
        request.asks[0].max_holders = 2;
        request
    };
    let ask = &capped("a").asks[0];
    // The gcra's key: its time, then its ledger.
    let state = sluice_core::key::redis_key("lease", &ask.rule, &ask.key, &ask.limit);
    let fund = |holder: &str, at_s: f64| keys.fund(capped(holder), at_s);
    let stored = || redis.cli(&["GET", &state]).unwrap().trim().to_owned();
    assert_eq!(fund("a", 0.0).await.share_per_ks, 10_000);
    assert_eq!(fund("b", 0.5).await.share_per_ks, 5_000);
    let before = stored();
    assert!(before.contains(" a=") && before.contains(" b="), "{before}");
    let c = fund("c", 1.0).await;
    assert!(c.crowded, "{c:?}");
    assert_eq!((c.granted, c.share_per_ks), (0, 0), "{c:?}");
    assert_eq!(
        c.more_in_ms, 9_000,
        "a's entry, written at 0 s for 10 s, ends first"
    );
    assert_eq!(
        stored(),
        before,
        "c is not written in, and nothing is taken for it"
    );
    let a = fund("a", 1.0).await;
    assert!(
        !a.crowded && a.granted > 0,
        "a named holder is funded: {a:?}"
    );
    assert_eq!(a.share_per_ks, 5_000, "c claims nothing");
    // b's entry ends at 10.5 s; a renews its own; c gets b's place.
    fund("a", 6.0).await;
    let c = fund("c", 10.6).await;
    assert!(!c.crowded && c.granted > 0, "{c:?}");
    assert_eq!(c.share_per_ks, 5_000, "c shares with a");
}

/// One step of [`the_fund_script_grants_and_writes_what_the_lease_script_does`]: a call of
/// `holder`'s asks, one a limit, at `at_us` after [`NOW`].
struct FundingStep {
    at_us: i64,
    holder: &'static str,
    asks: Vec<LeaseAsk>,
}

/// The quota service's fundings go to `lua/fund.lua`, which takes a holder alone in its ledger
/// on a path of its own: it must grant, answer and write exactly what `lua/lease.lua` does for
/// the same asks. Random fundings of three holders (wants, demands, carries and spans), their
/// withdrawals, and a secret holder that leases and gives units back (a pool in the ledger),
/// on every algorithm (a gcra of whole-microsecond intervals and one of thirds of one), are
/// run through both scripts on keys of their own: every answer, every state and every ledger
/// the same, by FCALL and by EVALSHA. (In replay time, as here, every key lives an hour:
/// expiries are not compared.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fund_script_grants_and_writes_what_the_lease_script_does() {
    use rand::{RngExt, SeedableRng};
    use sluice_core::key::ledger_key;
    use sluice_server::scripts::{LeaseCall, ScriptTime};
    use sluice_server::store::ScriptCalls;

    let limits = [
        r#"{"algorithm":"gcra","rate":10,"per":"1s","burst":20}"#,
        r#"{"algorithm":"gcra","rate":3,"per":"1s","burst":5}"#,
        r#"{"algorithm":"token_bucket","rate":7,"per":"2s","burst":4}"#,
        r#"{"algorithm":"leaky_bucket","rate":5,"per":"1s","burst":5}"#,
        r#"{"algorithm":"leaky_bucket","rate":5,"per":"1s","burst":5,"mode":"shaping","max_wait":"300ms"}"#,
        r#"{"algorithm":"sliding_window","limit":20,"window":"1s"}"#,
        r#"{"algorithm":"fixed_window","limit":30,"window":"1s"}"#,
        r#"{"algorithm":"sliding_log","limit":10,"window":"1s"}"#,
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(56);
    let mut at_us = 0;
    let mut steps = Vec::new();
    for _ in 0..150 {
        at_us += rng.random_range(0..1_500_000);
        // Half the time the last call again, as a busy bucket's steady fundings are.
        if let Some(last) = steps.last().filter(|_| rng.random_bool(0.5)) {
            let FundingStep { holder, asks, .. } = last;
            let (holder, asks) = (*holder, asks.clone());
            steps.push(FundingStep {
                at_us,
                holder,
                asks,
            });
            continue;
        }
        let holder = ["a", "b", "c", "f"][rng.random_range(0..4)];
        let asks = limits
            .iter()
            .map(|limit| {
                let span_ms = [1000, 2000, 15_000][rng.random_range(0..3)];
                let (want, demand) = match rng.random_range(0..6) {
                    0 => (0, 0),
                    1 => (rng.random_range(1..4), rng.random_range(0..3)),
                    _ => (1_000_000_000, rng.random_range(0..30)),
                };
                let body = if holder == "f" {
                    format!(
                        r#"{{"rule":"r","key":"k","limit":{limit},"terms":{{"max_units":6,"max_outstanding":9,"ttl":"3s"}},"want":{},"held":{},"returning":{}}}"#,
                        rng.random_range(0..6),
                        rng.random_range(0..4),
                        rng.random_range(0..3),
                    )
                } else {
                    format!(
                        r#"{{"rule":"r","key":"k","limit":{limit},"terms":{{"max_units":1000000000,"max_outstanding":1000000000,"ttl":"10s"}},"want":{want},"demand":{demand},"share_span_ms":{span_ms},"carry_per_k":{}}}"#,
                        rng.random_range(0..1000),
                    )
                };
                serde_json::from_str(&body).unwrap()
            })
            .collect();
        steps.push(FundingStep {
            at_us,
            holder,
            asks,
        });
    }

    for calls in [ScriptCalls::Functions, ScriptCalls::Eval] {
        let redis = RedisServer::start().unwrap();
        let store = common::connected_store_calling(Topology::Standalone(redis.url()), calls).await;
        let redis = redis::Client::open(redis.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let keys = |prefix: &str, asks: &[LeaseAsk]| -> Vec<String> {
            asks.iter()
                .enumerate()
                .map(|(i, ask)| {
                    sluice_core::key::redis_key(prefix, &ask.rule, &ask.key, &ask.limit)
                        + &format!("{i}")
                })
                .collect()
        };
        let mut funded = 0;
        for (n, step) in steps.iter().enumerate() {
            let time = ScriptTime::Replay(NOW + step.at_us);
            let secret = if step.holder == "f" { "s3cr3t" } else { "" };
            let pairs = |prefix| step.asks.iter().zip(keys(prefix, &step.asks));
            let general = LeaseCall::general(time, step.holder, secret, pairs("general"));
            let chosen = LeaseCall::new(time, step.holder, secret, pairs("chosen"));
            if chosen.script().function() != general.script().function() {
                funded += 1;
            }
            let by_lease = store.run_lease(&general).await.unwrap();
            let by_chosen = store.run_lease(&chosen).await.unwrap();
            assert_eq!(
                by_chosen, by_lease,
                "step {n} ({} at {} us)",
                step.holder, step.at_us
            );
            let stored = |prefix| {
                let keys: Vec<String> = keys(prefix, &step.asks)
                    .into_iter()
                    .flat_map(|key| [ledger_key(&key), key])
                    .collect();
                let mut redis = redis.clone();
                async move {
                    redis::cmd("MGET")
                        .arg(&keys)
                        .query_async::<Vec<Option<String>>>(&mut redis)
                        .await
                        .unwrap()
                }
            };
            assert_eq!(stored("chosen").await, stored("general").await, "step {n}");
        }
        assert!(funded > 50, "the fund script took {funded} of the calls");
    }
}
