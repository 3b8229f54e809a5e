//! sluice-server when Redis misbehaves: stopped and started again, stuck, flushed of its scripts,
//! clustered, failed over; and its graceful shutdown.

use crate::common;

use std::time::{Duration, Instant};

use common::load::Load;
use common::{Http, one_check, server};
use sluice_harness::{
    ForwardingProxy, MASTER_NAME, RedisCluster, RedisSentinel, RedisServer, free_port,
};
use sluice_server::clock::RedisClock;
use sluice_server::scripts::SCRIPTS;
use sluice_server::store::time::read_time_us;
use sluice_server::store::{ScriptCalls, Store, Topology};

const LIMIT: &str = r#"{"algorithm":"gcra","rate":1000000,"per":"1s","burst":1000000}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_mid_load_gives_503_and_its_return_gives_200_without_a_server_restart() {
    let mut redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |c| {
        c.redis_timeout = Duration::from_millis(300)
    })
    .await;
    let load = Load::start(&server.url(), "load", LIMIT, 8, 50);
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.restart().unwrap();
    // Requests succeed again by themselves.
    let http = Http::http1();
    let mut recovered = false;
    for _ in 0..100 {
        if http
            .decide(&server.url(), &one_check("probe", "p", LIMIT), &[])
            .await
            .status
            == 200
        {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let statuses: Vec<u16> = load.stop().await.iter().map(|a| a.status).collect();
    assert!(
        recovered,
        "the server never served again after Redis came back"
    );
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 503),
        "only 200 and 503: {:?}",
        statuses
            .iter()
            .filter(|s| **s != 200 && **s != 503)
            .collect::<Vec<_>>()
    );
    let outage = statuses.iter().filter(|s| **s == 503).count();
    assert!(outage > 0, "no request saw Redis gone");
    assert_eq!(*statuses.last().unwrap(), 200, "the load ends served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_redis_gets_503_when_the_timeout_expires_not_when_redis_answers() {
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |c| {
        c.redis_timeout = Duration::from_millis(300)
    })
    .await;
    // Redis answers nobody for 3 s.
    redis.cli(&["CLIENT", "PAUSE", "3000", "ALL"]).unwrap();
    let started = Instant::now();
    let answer = Http::http1()
        .decide(&server.url(), &one_check("r", "k", LIMIT), &[])
        .await;
    let waited = started.elapsed();
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert_eq!(answer.json()["error"], "redis: no answer within 300ms");
    assert!(
        waited < Duration::from_millis(2500),
        "the answer came when Redis woke ({waited:?}), not at the timeout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_read_held_up_by_a_paused_redis_does_not_move_the_carried_clock() {
    let redis = RedisServer::start().unwrap();
    let store = Store::connect(Topology::Standalone(redis.url()), Duration::from_secs(5));
    let clock = RedisClock::default();
    for _ in 0..100 {
        clock.read(&store).await;
        if clock.now_us(Instant::now()).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        clock.now_us(Instant::now()).is_some(),
        "no quick read of TIME"
    );
    // Redis answers nobody for 300 ms, and reads its clock for a TIME asked meanwhile when
    // the pause ends: taken at the read's midpoint, the carried time would run about 150 ms
    // ahead of Redis'.
    redis.cli(&["CLIENT", "PAUSE", "300", "ALL"]).unwrap();
    let started = Instant::now();
    clock.read(&store).await;
    let waited = started.elapsed();
    assert!(
        waited > Duration::from_millis(200),
        "the read waited {waited:?}"
    );

    let mut c = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let sent = Instant::now();
    let redis_now = read_time_us(&mut c).await.unwrap();
    let midpoint = sent + sent.elapsed() / 2;
    let off = clock.now_us(midpoint).unwrap() - redis_now;
    assert!(
        off.abs() < 20_000,
        "the carried clock is {off} µs off Redis' after a read that waited {waited:?}"
    );
}

/// Decides one check of `rule` for each key; every answer must be 200 (`case` names the
/// setting in a failure).
async fn decide_each_answered(
    http: &Http,
    server_url: &str,
    rule: &str,
    keys: impl IntoIterator<Item = String>,
    case: &str,
) {
    for key in keys {
        let answer = http
            .decide(server_url, &one_check(rule, &key, LIMIT), &[])
            .await;
        assert_eq!(answer.status, 200, "{case}: {}", answer.body);
    }
}

/// `node` holds sluice's functions library and ran its functions.
fn assert_ran_functions(node: &RedisServer) {
    let library = &SCRIPTS.library().name;
    let listed = node
        .cli(&["FUNCTION", "LIST", "LIBRARYNAME", library])
        .unwrap();
    assert!(
        listed.contains(library.as_str()),
        "node {} lacks the library",
        node.port()
    );
    assert!(
        common::calls(node, "fcall") > 0,
        "node {} ran no FCALL",
        node.port()
    );
}

/// Load on a server calling scripts `calls`' way while `flush` empties Redis of them 20 times:
/// no request fails, and the scripts were loaded again (`load`, a commandstats name).
async fn flush_mid_load_fails_no_request(calls: ScriptCalls, flush: &[&str], load: &str) {
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |c| {
        c.script_calls = calls
    })
    .await;
    let callers = Load::start(&server.url(), "load", LIMIT, 8, 50);
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(25)).await;
        assert_eq!(redis.cli(flush).unwrap().trim(), "OK");
    }
    let statuses: Vec<u16> = callers.stop().await.iter().map(|a| a.status).collect();
    assert!(statuses.len() > 200, "load was light: {}", statuses.len());
    assert!(
        statuses.iter().all(|s| *s == 200),
        "{} of {} failed",
        statuses.iter().filter(|s| **s != 200).count(),
        statuses.len()
    );
    let loads = common::calls(&redis, load);
    assert!(
        loads > 1,
        "the scripts were loaded again after a flush ({loads} loads)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_load_fails_no_request() {
    flush_mid_load_fails_no_request(ScriptCalls::Eval, &["SCRIPT", "FLUSH"], "script|load").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_flush_mid_load_fails_no_request() {
    flush_mid_load_fails_no_request(
        ScriptCalls::Functions,
        &["FUNCTION", "FLUSH"],
        "function|load",
    )
    .await;
}

/// Redis that will not run sluice's functions: without Functions (`FUNCTION` and `FCALL`
/// unknown, as before 7.0), and users whose ACL refuses loading them or calling them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_redis_refuses_functions_scripts_go_by_evalsha() {
    let without_functions = [
        "--rename-command",
        "FUNCTION",
        "",
        "--rename-command",
        "FCALL",
        "",
    ];
    let cases: [(&str, &[&str], Option<&str>); 3] = [
        ("no Functions", &without_functions, None),
        ("ACL -function", &[], Some("-function")),
        ("ACL -fcall", &[], Some("-fcall")),
    ];
    for (case, redis_args, refused) in cases {
        let redis = RedisServer::start_with(redis_args).unwrap();
        let url = match refused {
            Some(refused) => {
                redis
                    .cli(&[
                        "ACL", "SETUSER", "limited", "on", ">pw", "~*", "&*", "+@all", refused,
                    ])
                    .unwrap();
                format!("redis://limited:pw@127.0.0.1:{}", redis.port())
            }
            None => redis.url(),
        };
        let server = server(Topology::Standalone(url), |_| {}).await;
        let http = Http::http1();
        decide_each_answered(
            &http,
            &server.url(),
            "refused",
            (0..5).map(|i| format!("k{i}")),
            case,
        )
        .await;
        // The first EVALSHA of each script meets NOSCRIPT, and counts.
        let evalsha = common::calls(&redis, "evalsha");
        assert!(evalsha >= 5, "{case}: {evalsha} EVALSHA for 5 decisions");
        assert_eq!(common::calls(&redis, "fcall"), 0, "{case}: no FCALL ran");
        let metrics = http.get(&format!("{}/metrics", server.url())).await.body;
        assert!(
            metrics.contains("sluice_redis_functions 0"),
            "{case}: {metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_decision_path_works_on_a_cluster_with_keys_on_every_node() {
    let cluster = RedisCluster::start().unwrap();
    let server = server(Topology::Cluster(cluster.urls()), |_| {}).await;
    let http = Http::http1();
    let limit = r#"{"algorithm":"sliding_log","limit":3,"window":"1m"}"#;
    for client in 0..60 {
        let key = format!("198.51.100.{client}");
        let body = format!(
            r#"{{"checks":[{{"rule":"per-ip","key":"{key}","limit":{limit}}},{{"rule":"global","key":"all","limit":{LIMIT}}}]}}"#
        );
        let verdicts: Vec<bool> = {
            let mut v = Vec::new();
            for _ in 0..4 {
                v.push(
                    http.decide(&server.url(), &body, &[]).await.json()["results"][0]["allowed"]
                        .as_bool()
                        .unwrap(),
                );
            }
            v
        };
        assert_eq!(verdicts, [true, true, true, false], "{key}");
    }
    for node in cluster.nodes() {
        let keys: u64 = node.cli(&["DBSIZE"]).unwrap().trim().parse().unwrap();
        assert!(keys > 0, "node {} holds no key", node.port());
        assert_ran_functions(node);
    }
}

/// A Cluster node without the library, as a node added after the server connected is: calls
/// on its keys load the library there and succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_without_the_library_gets_it_on_its_first_call() {
    let cluster = RedisCluster::start().unwrap();
    let server = server(Topology::Cluster(cluster.urls()), |_| {}).await;
    let bare = &cluster.nodes()[1];
    assert_eq!(bare.cli(&["FUNCTION", "FLUSH"]).unwrap().trim(), "OK");
    let keys = (0..60).map(|client| format!("198.51.100.{client}"));
    decide_each_answered(
        &Http::http1(),
        &server.url(),
        "per-ip",
        keys,
        "one node flushed",
    )
    .await;
    assert_ran_functions(bare);
    assert_eq!(
        common::calls(bare, "evalsha"),
        0,
        "node {} fell back to EVALSHA",
        bare.port()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_the_server_follows_a_failover() {
    let sentinel = RedisSentinel::start().unwrap();
    let server = server(
        Topology::Sentinel {
            sentinels: vec![sentinel.sentinel_url()],
            master: MASTER_NAME.to_owned(),
        },
        |c| c.redis_timeout = Duration::from_millis(500),
    )
    .await;
    let http = Http::http1();
    let limit = r#"{"algorithm":"fixed_window","limit":100,"window":"1h"}"#;
    let first = http
        .decide(&server.url(), &one_check("r", "k", limit), &[])
        .await;
    assert_eq!(first.status, 200, "{}", first.body);
    let promoted = sentinel.replica.port();
    // The failover takes seconds; the server must keep running meanwhile.
    let new_primary = tokio::task::block_in_place(|| sentinel.fail_over()).unwrap();
    assert_eq!(new_primary, promoted, "the replica is the new primary");
    // Sentinel turns the old primary into a replica; writes there fail (READONLY) until the
    // server has asked the sentinel where the primary is now, and then succeed there, with the
    // scripts loaded again on the new primary.
    let demoted = || {
        sentinel
            .primary
            .cli(&["ROLE"])
            .unwrap()
            .starts_with("slave")
    };
    for _ in 0..200 {
        if demoted() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(demoted(), "sentinel never demoted the old primary");
    let mut last = 0;
    for _ in 0..200 {
        last = http
            .decide(&server.url(), &one_check("r", "after-failover", limit), &[])
            .await
            .status;
        if last == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(last, 200, "the server did not follow the failover");
    let written = sentinel
        .replica
        .cli(&["EXISTS", &common::state_key("r", "after-failover", limit)])
        .unwrap();
    assert_eq!(
        written.trim(),
        "1",
        "the decision was written on the new primary"
    );
}

/// While Redis is down a decision fails with the refused connection, as soon as the client
/// has tried to reconnect, rather than waiting out the whole timeout: a filter failing open
/// lets requests through without that wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_down_decisions_fail_on_the_refused_connection_not_the_timeout() {
    let mut redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |_| {}).await;
    let http = Http::http1();
    let body = one_check("r", "k", LIMIT);
    assert_eq!(http.decide(&server.url(), &body, &[]).await.status, 200);
    redis.kill();
    let mut errors = Vec::new();
    for _ in 0..20 {
        let answer = http.decide(&server.url(), &body, &[]).await;
        assert_eq!(answer.status, 503, "{}", answer.body);
        errors.push(answer.json()["error"].as_str().unwrap().to_owned());
    }
    let waited = errors
        .iter()
        .filter(|e| e.contains("no answer within"))
        .count();
    assert_eq!(waited, 0, "{errors:#?}");
}

/// Redis' host vanishing without a word (powered off, its address moved to another pod, a
/// partition), then a Redis answering at the same address again: the server's connection is
/// left open and silent, and nothing on it ever fails, so only the server can tell it is dead.
/// It opens a new one after a while with no answer, and decisions are answered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_gone_silent_is_replaced_and_decisions_recover() {
    let redis = RedisServer::start().unwrap();
    let proxy = ForwardingProxy::start(redis.addr()).unwrap();
    let timeout = Duration::from_millis(200);
    let server = server(Topology::Standalone(proxy.redis_url()), |c| {
        c.redis_timeout = timeout
    })
    .await;
    let http = Http::http1();
    let body = one_check("r", "k", LIMIT);
    assert_eq!(http.decide(&server.url(), &body, &[]).await.status, 200);

    proxy.silence();
    let silenced = Instant::now();
    let mut failed = 0;
    let recovered = loop {
        let answer = http.decide(&server.url(), &body, &[]).await;
        if answer.status == 200 {
            break Some(silenced.elapsed());
        }
        assert_eq!(answer.json()["error"], "redis: no answer within 200ms");
        failed += 1;
        if silenced.elapsed() > Duration::from_secs(15) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let recovered = recovered.expect("decisions never recovered from a connection gone silent");
    assert!(failed > 0, "no decision met the silent connection");
    assert!(
        recovered < Store::silent_after(timeout) + Duration::from_secs(2),
        "decisions recovered {recovered:?} after the connection went silent"
    );
}

/// The primary behind Sentinel crashing under load: once the sentinel has promoted its
/// replica, the server moves there by itself, and every request sent a second after is
/// answered. The first sentinel the server is given is down throughout, as one of a set may
/// be: the server asks the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_a_crashed_primary_is_followed_to_its_replica() {
    let mut sentinel = RedisSentinel::start().unwrap();
    let down = format!("redis://127.0.0.1:{}", free_port().unwrap());
    let server = server(
        Topology::Sentinel {
            sentinels: vec![down, sentinel.sentinel_url()],
            master: MASTER_NAME.to_owned(),
        },
        |_| {},
    )
    .await;
    let load = Load::start(&server.url(), "load", LIMIT, 4, 50);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let crashed = Instant::now();
    sentinel.primary.kill();
    let promoted = sentinel.replica.port();
    let replaced = tokio::task::block_in_place(|| {
        while sentinel.primary_port().ok() != Some(promoted) {
            assert!(crashed.elapsed() < Duration::from_secs(30), "no failover");
            std::thread::sleep(Duration::from_millis(20));
        }
        Instant::now()
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let answers = load.stop().await;
    let failed: Vec<_> = answers.iter().filter(|a| a.status != 200).collect();
    let last_failure = failed.iter().map(|a| a.sent).max();
    eprintln!(
        "the sentinel promoted the replica {:?} after the crash; {} of {} failed, the last sent {:?} after the crash",
        replaced - crashed,
        failed.len(),
        answers.len(),
        last_failure.map(|at| at - crashed)
    );
    let settled = replaced + Duration::from_secs(1);
    assert!(
        last_failure.is_none_or(|at| at < settled),
        "requests still failed {:?} after the promotion",
        last_failure.map(|at| at - replaced)
    );
    assert!(answers.iter().any(|a| a.sent > settled), "no request after");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_requests_in_flight() {
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |c| {
        c.redis_timeout = Duration::from_secs(5)
    })
    .await;
    let url = server.url();
    redis.cli(&["CLIENT", "PAUSE", "1000", "WRITE"]).unwrap();
    let in_flight = tokio::spawn({
        let url = url.clone();
        async move {
            Http::http1()
                .decide(&url, &one_check("r", "slow", LIMIT), &[])
                .await
                .status
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.stop().await.unwrap();
    assert_eq!(
        in_flight.await.unwrap(),
        200,
        "the request in flight was answered"
    );
    let refused = tokio::net::TcpStream::connect(url.trim_start_matches("http://")).await;
    assert!(refused.is_err(), "the server stopped listening");
}
