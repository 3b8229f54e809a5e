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
                &limit,
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
