//! sluice-server reaching Redis across a network: a proxy in between delays what passes each
//! way, as a link does.
//!
//! Decisions in flight together must each take one round trip to Redis. Every call to a node
//! goes down one connection, written while others are unanswered; with Nagle's algorithm on
//! that connection (the Redis client's default) each such write was held until Redis
//! acknowledged the last, which it does with its answer, so under steady load a decision took
//! two round trips.

use crate::common;

use std::time::{Duration, Instant};

use common::{Http, one_check, server, state_key};
use sluice_harness::{ForwardingProxy, RedisCluster, RedisServer, key_slot};
use sluice_server::store::Topology;

const LIMIT: &str = r#"{"algorithm":"gcra","rate":1000000,"per":"1s","burst":1000000}"#;
const RULE: &str = "net";

/// What the proxy adds each way.
const ONE_WAY: Duration = Duration::from_millis(10);

/// Callers asking at once, and the decisions each asks for in turn.
const CALLERS: u32 = 8;
const ROUNDS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_in_flight_together_each_take_one_round_trip_to_redis() {
    let redis = RedisServer::start().unwrap();
    let proxy = ForwardingProxy::with_latency(redis.addr(), ONE_WAY).unwrap();
    let server = server(Topology::Standalone(proxy.redis_url()), |c| {
        c.redis_timeout = Duration::from_secs(2)
    })
    .await;
    let keys = (0..CALLERS).map(|caller| format!("caller-{caller}"));
    assert_one_round_trip(&server.url(), keys.collect()).await;
}

/// The same on a Cluster, for the keys of a node reached through the proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_decisions_in_flight_together_each_take_one_round_trip_to_redis() {
    let cluster = RedisCluster::start().unwrap();
    let far = 0;
    let proxy = ForwardingProxy::with_latency(cluster.nodes()[far].addr(), ONE_WAY).unwrap();
    let others = cluster.reached_through(far, &proxy).unwrap();
    let server = server(Topology::Cluster(others), |c| {
        c.redis_timeout = Duration::from_secs(2)
    })
    .await;
    let owner = |key: &String| {
        let state = state_key(RULE, key, LIMIT);
        cluster.owner_of_slot(key_slot(&state)).unwrap()
    };
    let keys = (0..)
        .map(|n| format!("caller-{n}"))
        .filter(|key| owner(key) == far)
        .take(CALLERS as usize);
    assert_one_round_trip(&server.url(), keys.collect()).await;
}

/// Callers a fraction of a round trip apart, one a key, each asking again once answered, so
/// that calls are always in flight and start at different moments: the steady state's median
/// decision takes about one round trip through the proxy, not two.
async fn assert_one_round_trip(server: &str, keys: Vec<String>) {
    let round_trip = ONE_WAY * 2;
    let mut callers = Vec::new();
    for (caller, key) in (0..CALLERS).zip(keys) {
        let server = server.to_owned();
        callers.push(tokio::spawn(async move {
            tokio::time::sleep(round_trip * caller / CALLERS).await;
            let http = Http::http1();
            let body = one_check(RULE, &key, LIMIT);
            let mut took = Vec::with_capacity(ROUNDS);
            for _ in 0..ROUNDS {
                let sent = Instant::now();
                let answer = http.decide(&server, &body, &[]).await;
                assert_eq!(answer.status, 200, "{}", answer.body);
                took.push(sent.elapsed());
            }
            took
        }));
    }
    let mut took = Vec::new();
    for caller in callers {
        // The first rounds set the pace; the rest are the steady state.
        took.extend(caller.await.unwrap().into_iter().skip(ROUNDS / 4));
    }
    took.sort();
    let median = took[took.len() / 2];
    assert!(
        median < round_trip * 3 / 2,
        "a decision took {median:?} (median of {}) where a round trip to Redis is {round_trip:?}",
        took.len()
    );
}
