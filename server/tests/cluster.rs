//! Every script on a three-node Redis Cluster the test starts.

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
