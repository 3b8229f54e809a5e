//! The six scripts under concurrency, against the two classic bugs, and for expiry, on a real
//! redis-server each test starts.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use sluice_core::limit::{Algorithm, Limit};
use sluice_core::verdict::Verdict;
use sluice_core::wire::DecideRequest;
use sluice_harness::{RedisServer, clear_of_window_end};
use sluice_server::engine::Engine;
use sluice_server::metrics::Metrics;
use sluice_server::scripts::{ScriptCall, ScriptTime, decode_reply};
use sluice_server::store::time::read_time_us;
use sluice_server::store::{Store, Topology};

/// A limit of 100 for each algorithm, with refills so slow that a burst sees none.
fn hundred(algorithm: Algorithm) -> Limit {
    common::limit(&match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow => {
            format!(r#"{{"algorithm":"{algorithm}","limit":100,"window":"1h"}}"#)
        }
        _ => format!(r#"{{"algorithm":"{algorithm}","rate":1,"per":"1h","burst":100}}"#),
    })
}

async fn connections(redis: &RedisServer, n: usize) -> Vec<MultiplexedConnection> {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut all = Vec::new();
    for _ in 0..n {
        all.push(client.get_multiplexed_async_connection().await.unwrap());
    }
    all
}

async fn invoke(connection: &mut MultiplexedConnection, call: &ScriptCall) -> Verdict {
    let reply: redis::Value = call
        .script()
        .evalsha(std::slice::from_ref(&call.key), &call.args())
        .invoke_async(connection)
        .await
        .unwrap();
    decode_reply(&reply).unwrap()
}

/// Sends `times.len()` requests at once, request i at `times[i]`, spread over
/// 50 connections; returns how many were admitted.
async fn burst(redis: &RedisServer, limit: &Limit, key: &str, times: &[ScriptTime]) -> usize {
    let connections = connections(redis, 50).await;
    let tasks = times.iter().enumerate().map(|(i, now)| {
        let mut connection = connections[i % connections.len()].clone();
        let call = ScriptCall::new(limit, key.to_owned(), *now, 1, false);
        tokio::spawn(async move { invoke(&mut connection, &call).await.allowed })
    });
    join_all(tasks)
        .await
        .into_iter()
        .filter(|allowed| *allowed.as_ref().unwrap())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_concurrent_requests_admit_exactly_the_limit_on_redis_time() {
    let redis = RedisServer::start().unwrap();
    for algorithm in Algorithm::ALL {
        if algorithm == Algorithm::FixedWindow {
            // The burst must fall in one window of the hour.
            clear_of_window_end(Duration::from_secs(3600), Duration::from_secs(30));
        }
        let admitted = burst(
            &redis,
            &hundred(algorithm),
            &format!("burst:{algorithm}"),
            &[ScriptTime::Redis; 2000],
        )
        .await;
        assert_eq!(admitted, 100, "{algorithm}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_whose_clocks_are_out_of_order_never_over_admit() {
    // 2,000 concurrent callers whose clocks are spread over ten minutes and arrive shuffled:
    // the classic range-count bug lets those with older clocks in (15 for a limit of 10).
    let redis = RedisServer::start().unwrap();
    let base: i64 = 1_763_701_200_000_000; // a whole hour
    // Replicas carrying Redis' clock each on their own differ like this, only less.
    let mut times: Vec<ScriptTime> = (0..2000)
        .map(|i| ScriptTime::Carried(base + (i * 7919 % 2000) * 300_000))
        .collect();
    times.reverse();
    for algorithm in Algorithm::ALL {
        let admitted = burst(
            &redis,
            &hundred(algorithm),
            &format!("skew:{algorithm}"),
            &times,
        )
        .await;
        assert_eq!(admitted, 100, "{algorithm}");
    }
}

#[tokio::test]
async fn two_requests_in_the_same_microsecond_are_two_log_entries() {
    let redis = RedisServer::start().unwrap();
    let mut c = connections(&redis, 1).await.pop().unwrap();
    let limit = common::limit(r#"{"algorithm":"sliding_log","limit":3,"window":"1s"}"#);
    let now = 1_763_701_200_000_000;
    for _ in 0..2 {
        assert!(
            invoke(
                &mut c,
                &ScriptCall::new(&limit, "same-us".into(), ScriptTime::Replay(now), 1, false)
            )
            .await
            .allowed
        );
    }
    let entries: u64 = c.zcard("same-us").await.unwrap();
    assert_eq!(
        entries, 2,
        "two requests, two members, though their scores are equal"
    );
    let third = invoke(
        &mut c,
        &ScriptCall::new(&limit, "same-us".into(), ScriptTime::Replay(now), 1, false),
    )
    .await;
    assert!(third.allowed && third.remaining == 0);
    assert!(
        !invoke(
            &mut c,
            &ScriptCall::new(&limit, "same-us".into(), ScriptTime::Replay(now), 1, false)
        )
        .await
        .allowed
    );
}

/// Every algorithm with short windows, so that all of its state can expire during a test.
fn short(algorithm: Algorithm) -> Limit {
    common::limit(&match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow => {
            format!(r#"{{"algorithm":"{algorithm}","limit":5,"window":"300ms"}}"#)
        }
        Algorithm::LeakyBucket => {
            r#"{"algorithm":"leaky_bucket","rate":50,"per":"1s","burst":5,"mode":"shaping","max_wait":"200ms"}"#.to_owned()
        }
        _ => format!(r#"{{"algorithm":"{algorithm}","rate":50,"per":"1s","burst":5}}"#),
    })
}

#[tokio::test]
async fn every_key_expires_and_none_is_left_after_the_longest_window() {
    let redis = RedisServer::start().unwrap();
    let mut c = connections(&redis, 1).await.pop().unwrap();
    for algorithm in Algorithm::ALL {
        for (key, count_denied) in [("plain", false), ("counted", true)] {
            let key = format!("{algorithm}:{key}");
            for cost in [1, 1, 2, 0, 1, 9, 1, 1, 1, 1] {
                let call = ScriptCall::new(
                    &short(algorithm),
                    key.clone(),
                    ScriptTime::Redis,
                    cost,
                    count_denied,
                );
                invoke(&mut c, &call).await;
            }
            // Read the expiry at once: on a slow machine the first keys of a long loop may
            // already be gone (-2) by the time the last are written.
            let ttl: i64 = c.pttl(&key).await.unwrap();
            assert_ne!(ttl, -1, "{key} has no expiry");
            assert_ne!(ttl, -2, "{key} was never written");
            // The longest state here lives two windows (sliding_window) or a full refill.
            assert!(
                ttl <= 600,
                "{key} lives {ttl} ms, longer than its algorithm needs"
            );
        }
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let left: Vec<String> = c.keys("*").await.unwrap();
    assert!(
        left.is_empty(),
        "keys left after the longest window: {left:?}"
    );
}

#[tokio::test]
async fn replayed_keys_outlive_a_fast_virtual_clock_but_still_expire() {
    let redis = RedisServer::start().unwrap();
    let mut c = connections(&redis, 1).await.pop().unwrap();
    let call = ScriptCall::new(
        &short(Algorithm::Gcra),
        "replayed".into(),
        ScriptTime::Replay(1_763_701_200_000_000),
        1,
        false,
    );
    invoke(&mut c, &call).await;
    let ttl: i64 = c.pttl("replayed").await.unwrap();
    assert!(
        (3_000_000..=3_600_000).contains(&ttl),
        "replay keys live an hour of real time: {ttl}"
    );
}

/// A function keeps its library's state between calls, where a script starts afresh: a call
/// at Redis' time right after a replayed one must not keep the replay's hour, nor the other
/// way round.
#[tokio::test]
async fn as_functions_each_call_keeps_its_own_clock_and_expiry() {
    let redis = RedisServer::start().unwrap();
    let store =
        common::connected_store(sluice_server::store::Topology::Standalone(redis.url())).await;
    let mut c = connections(&redis, 1).await.pop().unwrap();
    // A key at Redis' time lives 10 s: long enough to be read back on a loaded machine (with
    // `short`'s 20 ms it had sometimes expired), and far from a replay's hour.
    let limit = common::limit(r#"{"algorithm":"gcra","rate":1,"per":"10s","burst":1}"#);
    let run = |key: &str, time: ScriptTime| {
        let call = ScriptCall::new(&limit, key.to_owned(), time, 1, false);
        let store = Arc::clone(&store);
        async move { store.run(&call).await.unwrap() }
    };
    run("replayed-first", ScriptTime::Replay(1_763_701_200_000_000)).await;
    run("live", ScriptTime::Redis).await;
    run("replayed-again", ScriptTime::Replay(1_763_701_200_000_000)).await;
    assert!(store.calls_functions(), "the store fell back to EVALSHA");
    assert!(common::calls(&redis, "fcall") >= 3);
    let live: i64 = c.pttl("live").await.unwrap();
    assert!(
        (1..=10_000).contains(&live),
        "a call at Redis' time after a replayed one lives {live} ms"
    );
    for key in ["replayed-first", "replayed-again"] {
        let ttl: i64 = c.pttl(key).await.unwrap();
        assert!(
            (3_000_000..=3_600_000).contains(&ttl),
            "{key} lives {ttl} ms, not a replay's hour"
        );
    }
}

#[tokio::test]
async fn a_cost_above_capacity_is_denied_for_good_and_consumes_nothing() {
    let redis = RedisServer::start().unwrap();
    let mut c = connections(&redis, 1).await.pop().unwrap();
    for algorithm in Algorithm::ALL {
        for count_denied in [false, true] {
            let key = format!("huge:{algorithm}:{count_denied}");
            let verdict = invoke(
                &mut c,
                &ScriptCall::new(
                    &hundred(algorithm),
                    key.clone(),
                    ScriptTime::Redis,
                    101,
                    count_denied,
                ),
            )
            .await;
            // Denied, and no retry time: no wait admits it.
            assert!(
                !verdict.allowed && verdict.retry_after_ms.is_none(),
                "{algorithm}: {verdict:?}"
            );
            assert_eq!(verdict.remaining, 100, "{algorithm}: nothing consumed");
            let exists: bool = c.exists(&key).await.unwrap();
            assert!(
                !exists,
                "{algorithm}: an impossible request writes no state"
            );
        }
    }
}

#[tokio::test]
async fn a_key_holding_a_value_of_another_shape_is_an_error_that_names_it() {
    let redis = RedisServer::start().unwrap();
    let store =
        common::connected_store(sluice_server::store::Topology::Standalone(redis.url())).await;
    let mut c = connections(&redis, 1).await.pop().unwrap();
    for algorithm in Algorithm::ALL
        .into_iter()
        .filter(|a| *a != Algorithm::SlidingLog)
    {
        let key = format!("foreign:{algorithm}");
        let _: () = c.set(&key, "not-sluice").await.unwrap();
        let error = store
            .run(&ScriptCall::new(
                &hundred(algorithm),
                key.clone(),
                ScriptTime::Redis,
                1,
                false,
            ))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(&format!(r#"key {key} holds "not-sluice""#)),
            "{algorithm}: {error}"
        );
        let value: String = c.get(&key).await.unwrap();
        assert_eq!(value, "not-sluice", "{algorithm}: left as it was");
    }
}

/// Regression: member suffixes were the count of entries at that microsecond; once counted
/// denials had trimmed the oldest by rank, that count could name a member still there, the new
/// entry silently replaced it, and the script's own count of entries went wrong (found by the
/// differential test).
#[tokio::test]
async fn counted_denials_that_trim_the_log_never_reuse_a_member() {
    let redis = RedisServer::start().unwrap();
    let mut c = connections(&redis, 1).await.pop().unwrap();
    let limit = common::limit(r#"{"algorithm":"sliding_log","limit":3,"window":"1m"}"#);
    let now = 1_763_701_200_000_000;
    for _ in 0..40 {
        invoke(
            &mut c,
            &ScriptCall::new(&limit, "trimmed".into(), ScriptTime::Replay(now), 1, true),
        )
        .await;
        let entries: u64 = c.zcard("trimmed").await.unwrap();
        let members: Vec<String> = c.zrange("trimmed", 0, -1).await.unwrap();
        let distinct: std::collections::HashSet<&String> = members.iter().collect();
        assert_eq!(distinct.len() as u64, entries);
    }
    let entries: u64 = c.zcard("trimmed").await.unwrap();
    assert_eq!(
        entries, 6,
        "counted denials keep the newest 2 x limit entries"
    );
}

#[tokio::test]
async fn the_server_carries_redis_clock_and_spares_each_decision_a_time_command() {
    let redis = RedisServer::start().unwrap();
    let store = Store::connect(Topology::Standalone(redis.url()), Duration::from_secs(1));
    let engine = Engine::new(
        Arc::clone(&store),
        "clock".to_owned(),
        Arc::new(Metrics::default()),
    );
    let mut c = connections(&redis, 1).await.pop().unwrap();
    let mut carried = None;
    for _ in 0..60 {
        if let ScriptTime::Carried(us) = engine.time(None) {
            carried = Some(us);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let carried = carried.expect("the server read Redis' TIME within 3 s");
    let redis_now = read_time_us(&mut c).await.unwrap();
    assert!(
        (redis_now - carried).abs() < 20_000,
        "carried {carried} against Redis' {redis_now}"
    );

    let time_calls = |info: String| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_time:calls="))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    };
    let info = || {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("commandstats");
        cmd
    };
    let before = time_calls(info().query_async(&mut c).await.unwrap());
    let request: DecideRequest = serde_json::from_str(
        r#"{"checks":[{"rule":"r","key":"k","limit":{"algorithm":"gcra","rate":10,"per":"1s","burst":5}}]}"#,
    )
    .unwrap();
    let mut admitted = 0;
    for _ in 0..100 {
        let answer = engine.decide(&request, None).await.unwrap();
        admitted += usize::from(answer.results[0].allowed);
    }
    let after = time_calls(info().query_async(&mut c).await.unwrap());
    // The background read runs once a second; the 100 decisions themselves read no TIME.
    assert!(after - before <= 1, "{} TIME calls", after - before);
    assert!((5..=6).contains(&admitted), "admitted {admitted}");
}
