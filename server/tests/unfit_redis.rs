//! One server given (`--redis`) that answers but cannot hold the limits: a Cluster's node, or a
//! replica, from the start or after a failover. The server said it was ready and failed the
//! decisions; it must stay unready, and say what to give instead, until it reaches one that can.

use crate::common;

use std::time::Duration;

use common::{Http, one_check};
use sluice_harness::{ForwardingProxy, RedisCluster, RedisServer};
use sluice_server::store::Topology;
use sluice_server::{RunningServer, ServerConfig};

const LIMIT: &str = r#"{"algorithm":"gcra","rate":1,"per":"1s","burst":1}"#;

/// A server for the one Redis at `url`, once `/readyz` gives the error `named` looks for; it
/// must never say it is ready before.
async fn refused(url: &str, named: impl Fn(&str) -> bool) -> RunningServer {
    let server = sluice_server::spawn(ServerConfig::standalone(url), ([127, 0, 0, 1], 0).into())
        .await
        .unwrap();
    let http = Http::http1();
    for _ in 0..200 {
        let answer = http.get(&format!("{}/readyz", server.url())).await;
        assert_ne!(answer.status, 200, "ready on {url}");
        if named(&answer.body) {
            return server;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{url} was never refused by name");
}

/// Six decisions for keys spread over a Cluster's slots each fail with `named`'s error.
async fn each_decision_fails(server: &RunningServer, named: impl Fn(&str) -> bool) {
    let http = Http::http1();
    for client in 0..6 {
        let key = format!("10.0.0.{client}");
        let decision = http
            .decide(&server.url(), &one_check("r", &key, LIMIT), &[])
            .await;
        assert_eq!(decision.status, 503, "{}", decision.body);
        assert!(named(&decision.body), "{}", decision.body);
    }
}

/// A Cluster's node answers `MOVED` for the keys of the other nodes' slots: two decisions in
/// three failed on three nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_given_as_one_server_is_refused_by_name() {
    let cluster = RedisCluster::start().unwrap();
    let node = cluster.urls().remove(0);
    let named = |error: &str| {
        error.contains(&format!("`{node}` is a node of a Redis Cluster"))
            && error.contains("--redis-cluster")
    };
    let server = refused(&node, named).await;
    each_decision_fails(&server, named).await;
}

/// A replica refuses the scripts' writes: every decision failed. Promoted, it is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_is_refused_by_name_until_it_is_promoted() {
    let primary = RedisServer::start().unwrap();
    let replica =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port().to_string()])
            .unwrap();
    let named = |error: &str| {
        error.contains(&format!(
            "`{}` is a replica of 127.0.0.1:{}",
            replica.url(),
            primary.port()
        )) && error.contains("--redis-sentinel")
    };
    let server = refused(&replica.url(), named).await;
    each_decision_fails(&server, named).await;

    replica.cli(&["REPLICAOF", "NO", "ONE"]).unwrap();
    let http = Http::http1();
    let mut ready = false;
    for _ in 0..200 {
        if http.get(&format!("{}/readyz", server.url())).await.status == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(ready, "the promoted replica was never taken");
    let decision = http
        .decide(&server.url(), &one_check("r", "10.0.0.1", LIMIT), &[])
        .await;
    assert_eq!(decision.status, 200, "{}", decision.body);
}

/// A failover behind one name (a managed Redis's primary endpoint): the primary is demoted,
/// its replica promoted, and the name moves to it. The server's connection, which outlives
/// the demotion, met every decision with `READONLY` for as long as it stood; the server must
/// connect afresh and follow the name to the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_behind_one_name_the_server_follows_it_to_the_new_primary() {
    let old = RedisServer::start().unwrap();
    let new =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &old.port().to_string()]).unwrap();
    let name = ForwardingProxy::start(old.addr()).unwrap();
    let server = common::server(Topology::Standalone(name.redis_url()), |_| {}).await;
    let http = Http::http1();
    let (url, check) = (server.url(), one_check("r", "10.0.0.1", LIMIT));
    let decide = || http.decide(&url, &check, &[]);
    assert_eq!(decide().await.status, 200);

    new.cli(&["REPLICAOF", "NO", "ONE"]).unwrap();
    old.cli(&["REPLICAOF", "127.0.0.1", &new.port().to_string()])
        .unwrap();
    name.retarget(new.addr());
    let mut statuses = Vec::new();
    for _ in 0..100 {
        let answer = decide().await;
        statuses.push(answer.status);
        if answer.status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(statuses.last(), Some(&200), "{statuses:?}");
    let key = common::state_key("r", "10.0.0.1", LIMIT);
    assert_eq!(new.cli(&["EXISTS", &key]).unwrap().trim(), "1");
}
