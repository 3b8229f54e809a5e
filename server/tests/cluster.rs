//! Every script on a three-node Redis Cluster the test starts, and the one clock servers read
//! there.

use crate::common;

use sluice_core::algorithm::{Request, State, Update};
use sluice_core::key::{LimitKey, RuleName, redis_key};
use sluice_core::limit::Algorithm;
use sluice_harness::RedisCluster;
use sluice_server::scripts::{ScriptCall, ScriptTime};
use sluice_server::store::Topology;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_script_runs_on_a_cluster_with_keys_on_every_node() {
    let cluster = RedisCluster::start().unwrap();
    let store = common::connected_store(Topology::Cluster(cluster.urls())).await;
    let now = 1_763_700_000_000_000;
    for algorithm in Algorithm::ALL {
        let limit = common::limit(&match algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow => {
                format!(r#"{{"algorithm":"{algorithm}","limit":3,"window":"1m"}}"#)
            }
            _ => format!(r#"{{"algorithm":"{algorithm}","rate":1,"per":"1m","burst":3}}"#),
        });
        let rule = RuleName::new(format!("cluster-{algorithm}")).unwrap();
        for client in 0..30 {
            let key = redis_key(
                "sluice",
                &rule,
                &LimitKey::from_parts([format!("10.0.0.{client}").as_bytes()]),
                algorithm,
            );
            let mut state: Option<State> = None;
            for step in 0..5 {
                let request = Request::one_at(now + step);
                let model = limit.decide(state.as_ref(), request);
                let script = store
                    .run(&ScriptCall::new(
                        &limit,
                        key.clone(),
                        ScriptTime::Replay(request.now_us),
                        1,
                        false,
                    ))
                    .await
                    .unwrap();
                assert_eq!(script, model.verdict, "{algorithm} {key} step {step}");
                if let Update::Write { state: s, .. } = model.update {
                    state = Some(s);
                }
            }
        }
    }
    for node in cluster.nodes() {
        let keys: u64 = node.cli(&["DBSIZE"]).unwrap().trim().parse().unwrap();
        assert!(
            keys > 0,
            "node {} holds no key: the keys did not spread",
            node.port()
        );
    }
}

/// On a Cluster every server reads one node's clock, the primary's that serves slot 0: nodes'
/// clocks differ, and servers reading whichever node the client picked would carry times apart
/// by that much.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_clock_is_read_from_the_primary_of_slot_zero() {
    let cluster = RedisCluster::start().unwrap();
    let store = common::connected_store(Topology::Cluster(cluster.urls())).await;
    for _ in 0..12 {
        store.time_us().await.unwrap();
    }
    let owner = cluster.owner_of_slot(0).unwrap();
    let reads: Vec<u64> = cluster
        .nodes()
        .iter()
        .map(|node| common::calls(node, "time"))
        .collect();
    let elsewhere: u64 = reads
        .iter()
        .enumerate()
        .filter(|&(node, _)| node != owner)
        .map(|(_, reads)| reads)
        .sum();
    assert!(
        reads[owner] >= 12 && elsewhere == 0,
        "TIME by node {reads:?}; slot 0 is node {owner}'s"
    );
}

/// A Cluster's node given as one server (`--redis`) answers `MOVED` for the keys of the other
/// nodes' slots: the server said it was ready and failed two decisions in three. It must stay
/// unready instead, saying what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_given_as_one_server_is_refused_and_named() {
    let cluster = RedisCluster::start().unwrap();
    let node = cluster.urls().remove(0);
    let server = sluice_server::spawn(
        sluice_server::ServerConfig::standalone(node.clone()),
        ([127, 0, 0, 1], 0).into(),
    )
    .await
    .unwrap();
    let http = common::Http::http1();
    let named = |error: &str| {
        error.contains(&format!("`{node}` is a node of a Redis Cluster"))
            && error.contains("--redis-cluster")
    };
    let mut answer = http.get(&format!("{}/readyz", server.url())).await;
    for _ in 0..200 {
        assert_ne!(
            answer.status, 200,
            "ready on a Cluster's node given as one server"
        );
        if named(&answer.body) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        answer = http.get(&format!("{}/readyz", server.url())).await;
    }
    assert!(named(&answer.body), "{}", answer.body);
    let limit = r#"{"algorithm":"gcra","rate":1,"per":"1s","burst":1}"#;
    for client in 0..6 {
        let decision = http
            .decide(
                &server.url(),
                &common::one_check("r", &format!("10.0.0.{client}"), limit),
                &[],
            )
            .await;
        assert_eq!(decision.status, 503, "{}", decision.body);
        assert!(named(&decision.body), "{}", decision.body);
    }
}
