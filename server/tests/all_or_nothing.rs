//! A denied request consumes nothing from any rule, on a real server: on one Redis (the batch
//! script decides the request atomically), on a three-node Redis Cluster (two phases), and the
//! race the Cluster's two phases leave, shown with its bound.
//!
//! The sequence is a new user's: rule `a` allows 5 a minute per client, rule `b` 1 a minute per
//! route, both on every request. The first request passes both; every later one is denied by
//! `b`, and must leave `a` at 4 however many there are.

use crate::common;

use std::sync::Arc;

use common::{Http, server};
use sluice_core::wire::DecideRequest;
use sluice_harness::{RedisCluster, RedisServer};
use sluice_server::engine::Engine;
use sluice_server::metrics::Metrics;
use sluice_server::store::Topology;

// Windows as long as a limit's may be: no test here sees one turn over and admit again.
const A: &str = r#"{"algorithm":"fixed_window","limit":5,"window":"30d"}"#;
const B: &str = r#"{"algorithm":"fixed_window","limit":1,"window":"30d"}"#;

/// A request with rule `a` on the client and rule `b` (with `b_extra` fields) on the route.
fn two_rules(b_extra: &str) -> String {
    format!(
        r#"{{"checks":[{{"rule":"a","key":"client","limit":{A}}},{{"rule":"b","key":"route","limit":{B}{b_extra}}}]}}"#
    )
}

/// What one request came to: whether `a` and `b` admitted it, and `a`'s remaining.
#[derive(Debug, PartialEq)]
struct Answer {
    a: bool,
    b: bool,
    a_remaining: u64,
}

async fn send(http: &Http, url: &str, body: &str, times: usize) -> Vec<Answer> {
    let mut answers = Vec::new();
    for _ in 0..times {
        let answer = http.decide(url, body, &[]).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        let json = answer.json();
        let results = &json["results"];
        answers.push(Answer {
            a: results[0]["allowed"].as_bool().unwrap(),
            b: results[1]["allowed"].as_bool().unwrap(),
            a_remaining: results[0]["remaining"].as_u64().unwrap(),
        });
    }
    answers
}

/// The count `b` holds for the route, read from whichever node has the key.
fn b_count(nodes: &[&RedisServer], prefix: &str) -> u64 {
    let key = common::prefixed_state_key(prefix, "b", "route", B);
    for node in nodes {
        // `<window>:<count>` on the node that owns the key; a MOVED error on the others.
        let value = node.cli(&["GET", &key]).unwrap();
        if let Some((window, count)) = value.trim().split_once(':')
            && window.parse::<u64>().is_ok()
        {
            return count.parse().unwrap();
        }
    }
    panic!("no node holds {key}");
}

/// The whole sequence against a server on `topology`, each variant under its own prefix.
async fn the_denied_request_consumes_nothing(topology: Topology, nodes: &[&RedisServer]) {
    let http = Http::http1();

    let plain = server(topology.clone(), |c| c.key_prefix = "plain".into()).await;
    let answers = send(&http, &plain.url(), &two_rules(""), 12).await;
    assert_eq!(
        answers[0],
        Answer {
            a: true,
            b: true,
            a_remaining: 4
        }
    );
    for (i, answer) in answers.iter().enumerate().skip(1) {
        // `b` denies; `a` would admit, and answers as asked at cost 0: still 4 left.
        let expected = Answer {
            a: true,
            b: false,
            a_remaining: 4,
        };
        assert_eq!(*answer, expected, "request {i}");
    }
    assert_eq!(
        b_count(nodes, "plain"),
        1,
        "b's own denials are not counted"
    );
    let metrics = http.get(&format!("{}/metrics", plain.url())).await.body;
    for line in [
        r#"sluice_decisions_total{rule="a",outcome="allowed"} 1"#,
        r#"sluice_decisions_total{rule="a",outcome="skipped"} 11"#,
        r#"sluice_decisions_total{rule="b",outcome="denied"} 11"#,
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }

    // With count_denied, `b` counts its own denials (up to twice its limit); `a` still does not.
    let counting = server(topology.clone(), |c| c.key_prefix = "counting".into()).await;
    let answers = send(
        &http,
        &counting.url(),
        &two_rules(r#","count_denied":true"#),
        6,
    )
    .await;
    assert!(
        answers[1..].iter().all(|a| !a.b && a.a_remaining == 4),
        "{answers:?}"
    );
    assert_eq!(b_count(nodes, "counting"), 2, "b counts its denials");

    // In shadow, `b` never blocks: `a` consumes as it would alone.
    let shadow = server(topology, |c| c.key_prefix = "shadow".into()).await;
    let answers = send(&http, &shadow.url(), &two_rules(r#","shadow":true"#), 7).await;
    let a_remaining: Vec<u64> = answers.iter().map(|a| a.a_remaining).collect();
    let a_allowed: Vec<bool> = answers.iter().map(|a| a.a).collect();
    assert_eq!(a_remaining, [4, 3, 2, 1, 0, 0, 0]);
    assert_eq!(a_allowed, [true, true, true, true, true, false, false]);
    assert!(answers[1..5].iter().all(|a| !a.b), "b would have denied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_denied_by_one_rule_consumes_nothing_from_another() {
    let redis = RedisServer::start().unwrap();
    the_denied_request_consumes_nothing(Topology::Standalone(redis.url()), &[&redis]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_denied_by_one_rule_consumes_nothing_from_another_on_a_cluster() {
    let cluster = RedisCluster::start().unwrap();
    let nodes: Vec<&RedisServer> = cluster.nodes().iter().collect();
    the_denied_request_consumes_nothing(Topology::Cluster(cluster.urls()), &nodes).await;
}

/// On a Cluster the request's checks are asked in one phase and consume in the next. A request
/// that takes a key's last unit in between makes the second phase deny a check the first found
/// room in: the request is denied, and its other checks have consumed, exactly their cost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn between_the_cluster_phases_a_race_costs_at_most_the_request_cost_on_each_other_rule() {
    let cluster = RedisCluster::start().unwrap();
    let store = common::connected_store(Topology::Cluster(cluster.urls())).await;
    let metrics = Arc::new(Metrics::default());
    let engine = Engine::new(store, "race".to_owned(), Arc::clone(&metrics));
    let tight = r#"{"algorithm":"fixed_window","limit":1,"window":"30d"}"#;
    let loose = r#"{"algorithm":"fixed_window","limit":100,"window":"30d"}"#;
    let request = |cost: u64| {
        DecideRequest::from_json(
            format!(
                r#"{{"checks":[{{"rule":"tight","key":"k","limit":{tight},"cost":{cost}}},{{"rule":"loose","key":"k","limit":{loose},"cost":{cost}}}]}}"#
            )
            .as_bytes(),
        )
        .unwrap()
    };
    let only_tight = DecideRequest::from_json(
        format!(r#"{{"checks":[{{"rule":"tight","key":"k","limit":{tight}}}]}}"#).as_bytes(),
    )
    .unwrap();

    // Phase one finds room in `tight` (`loose`, the last enforced check, is not asked)...
    let probe = engine
        .probe(engine.calls(&request(1), engine.time(None)))
        .await
        .unwrap();
    assert!(!probe.blocked());
    // ... another request takes `tight`'s only unit ...
    let other = engine.decide(&only_tight, None).await.unwrap();
    assert!(other.results[0].allowed);
    // ... and phase two: `loose` consumes first, then `tight` denies.
    let verdicts = engine.settle(probe).await.unwrap();
    assert!(!verdicts[0].allowed, "tight denies in the second phase");
    assert!(verdicts[1].allowed);
    assert_eq!(
        verdicts[1].remaining, 99,
        "the race cost `loose` the request's cost, 1"
    );
    assert!(
        metrics
            .render()
            .contains("sluice_split_decision_races_total 1"),
        "{}",
        metrics.render()
    );

    // Without a request in between, a denied request consumes nothing from `loose`.
    for _ in 0..5 {
        let answer = engine.decide(&request(1), None).await.unwrap();
        assert!(!answer.results[0].allowed);
        assert_eq!(answer.results[1].remaining, 99);
    }
    assert!(
        metrics
            .render()
            .contains("sluice_split_decision_races_total 1")
    );
}
