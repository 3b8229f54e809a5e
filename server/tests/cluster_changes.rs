//! A Redis Cluster changing under the server's load, as operators change one: a slot moved
//! key by key, a reshard by `redis-cli`, a primary lost and replaced by its replica. Moving
//! slots fails no request and keeps every count; a lost primary fails requests until its
//! replica takes over (only its own keys', unless Redis wants every slot covered), and keeps
//! the counts it had replicated.

use crate::common;
use crate::redis_access::user_with_documented_acl;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::load::{Answered, Load};
use common::{Http, one_check, state_key};
use sluice_harness::{ForwardingProxy, RedisCluster, key_slot};
use sluice_server::store::{ScriptCalls, Store, Topology};

/// Counts every request, and never denies one here. Its window is the longest a limit may
/// have, and each test that counts in it starts clear of its end
/// ([`clear_of_the_counting_window_end`]): with an hour's window, a failover test once saw the
/// hour turn, and a key of a primary that stayed up kept 16 of its 29 counts.
const COUNTING: &str = r#"{"algorithm":"fixed_window","limit":1000000000,"window":"30d"}"#;
const COUNTING_LIMIT: u64 = 1_000_000_000;
const COUNTING_WINDOW: Duration = Duration::from_secs(30 * 86_400);

/// Waits, if it must, until the window of [`COUNTING`] (and of every fixed window here) has
/// longer left than any test here takes.
fn clear_of_the_counting_window_end() {
    sluice_harness::clear_of_window_end(COUNTING_WINDOW, Duration::from_secs(120));
}

/// The Redis key of the load's `key` (a fixed window).
fn load_key(key: &str) -> String {
    state_key("load", key, COUNTING)
}

/// The load's keys: `k<task>-<n>`, `keys` for each of `tasks` callers.
fn load_keys(tasks: usize, keys: usize) -> impl Iterator<Item = String> {
    (0..tasks).flat_map(move |t| (0..keys).map(move |n| format!("k{t}-{n}")))
}

/// One decision: its status and, when answered, what remains.
async fn decide(http: &Http, server: &str, body: &str) -> (u16, Option<u64>) {
    let answer = http.decide(server, body, &[]).await;
    let remaining = (answer.status == 200)
        .then(|| answer.json()["results"][0]["remaining"].as_u64())
        .flatten();
    (answer.status, remaining)
}

/// Each step of a slot moving under a key, as `redis-cli --cluster reshard` takes it: the key
/// keeps its count, and every decision is answered, by the documented ACL alone (`+asking`
/// is used here: the slot's old owner sends the client on with `ASK` once the key has moved).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_keeps_its_count_through_each_step_of_its_slot_moving() {
    clear_of_the_counting_window_end();
    let cluster = RedisCluster::start().unwrap();
    let urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|node| user_with_documented_acl(node, "acl-cluster"))
        .collect();
    let http = Http::http1();
    for calls in [ScriptCalls::Functions, ScriptCalls::Eval] {
        let running =
            common::server(Topology::Cluster(urls.clone()), |c| c.script_calls = calls).await;
        let server = running.url();
        let rule = format!("moving-{calls:?}").to_lowercase();
        let limit = r#"{"algorithm":"fixed_window","limit":9,"window":"30d"}"#;
        let body = one_check(&rule, "k", limit);
        let redis_key = state_key(&rule, "k", limit);
        let slot = key_slot(&redis_key);
        let said = cluster.nodes()[0].cli(&["CLUSTER", "KEYSLOT", &redis_key]);
        assert_eq!(said.unwrap().trim(), slot.to_string(), "{redis_key}'s slot");
        let from = cluster.owner_of_slot(slot).unwrap();
        let to = (from + 1) % cluster.nodes().len();
        let asking_before = common::calls(&cluster.nodes()[to], "asking");

        let mut answers = Vec::new();
        for _ in 0..2 {
            answers.push(decide(&http, &server, &body).await);
        }
        let moving = cluster.begin_slot_move(slot, to).unwrap();
        // The key is still on its old owner, which serves it.
        for _ in 0..2 {
            answers.push(decide(&http, &server, &body).await);
        }
        assert_eq!(
            moving.migrate_keys().unwrap(),
            1,
            "{calls:?}: the key moves"
        );
        // The old owner answers ASK; the new one serves the key once asked.
        for _ in 0..2 {
            answers.push(decide(&http, &server, &body).await);
        }
        moving.finish().unwrap();
        // The old owner answers MOVED, and the client learns the new map.
        for _ in 0..4 {
            answers.push(decide(&http, &server, &body).await);
        }
        let expected: Vec<(u16, Option<u64>)> = [8, 7, 6, 5, 4, 3, 2, 1, 0, 0]
            .into_iter()
            .map(|remaining| (200, Some(remaining)))
            .collect();
        assert_eq!(
            answers, expected,
            "{calls:?}: status and remaining, in turn"
        );
        assert!(
            common::calls(&cluster.nodes()[to], "asking") > asking_before,
            "{calls:?}: the server never followed an ASK"
        );
        assert_eq!(cluster.owner_of_slot(slot).unwrap(), to, "{calls:?}");
    }
    for node in cluster.nodes() {
        let log = node.cli(&["ACL", "LOG"]).unwrap();
        assert!(log.trim().is_empty(), "{} refused: {log}", node.port());
    }
}

/// A lease's two keys (its rule's state and its ledger: a sliding window's, since a bucket
/// keeps its ledger in its one key) moved by two `MIGRATE`s, as a reshard may move them: in
/// between, the old owner holds one and refuses the call (`TRYAGAIN`), and the client tries
/// again within the call's time, so the ask in flight is answered once both have moved, out
/// of the ledger as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_asked_while_its_two_keys_move_apart_is_answered_once_both_have() {
    let cluster = RedisCluster::start().unwrap();
    // A second: every wait before trying again is then at least 50 ms, time enough for this
    // test to move the second key, however busy the machine.
    let running = common::server(Topology::Cluster(cluster.urls()), |c| {
        c.redis_timeout = Duration::from_secs(1);
    })
    .await;
    let lease = format!("{}/v1/lease", running.url());
    let ask = |holder: &str| {
        format!(
            r#"{{"holder":"{holder}","asks":[{{"rule":"leased","key":"k","limit":{{"algorithm":"sliding_window","limit":20,"window":"1m"}},"terms":{{"max_units":5,"max_outstanding":10,"ttl":"1m"}},"want":5,"held":0,"returning":0}}]}}"#
        )
    };
    let http = Http::http1();
    let granted = |answer: common::Answer| {
        assert_eq!(answer.status, 200, "{}", answer.body);
        answer.json()["grants"][0]["granted"].as_u64().unwrap()
    };
    let headers = [("content-type", "application/json")];
    assert_eq!(
        granted(http.send("POST", &lease, &headers, ask("a")).await),
        5
    );

    let slot = key_slot(&state_key(
        "leased",
        "k",
        r#"{"algorithm":"sliding_window","limit":20,"window":"1m"}"#,
    ));
    let to = (cluster.owner_of_slot(slot).unwrap() + 1) % cluster.nodes().len();
    let from = cluster.owner_of_slot(slot).unwrap();
    let moving = cluster.begin_slot_move(slot, to).unwrap();
    let keys = cluster.nodes()[from]
        .cli(&["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "10"])
        .unwrap();
    let (ledger, state): (Vec<&str>, Vec<&str>) = keys
        .lines()
        .map(str::trim)
        .partition(|key| key.ends_with(":ledger"));
    assert_eq!(
        (ledger.len(), state.len()),
        (1, 1),
        "the slot holds {keys:?}"
    );
    moving.migrate(&ledger).unwrap();

    let refused_before = common::errors(&cluster.nodes()[from], "TRYAGAIN");
    let in_flight = tokio::spawn({
        let (http, lease, body) = (http.clone(), lease.clone(), ask("b"));
        async move { http.send("POST", &lease, &headers, body).await }
    });
    let waiting = Instant::now();
    while common::errors(&cluster.nodes()[from], "TRYAGAIN") == refused_before {
        assert!(waiting.elapsed() < Duration::from_secs(5), "no TRYAGAIN");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    moving.migrate(&state).unwrap();
    assert_eq!(granted(in_flight.await.unwrap()), 5, "the ask in flight");
    moving.finish().unwrap();
    assert_eq!(
        granted(http.send("POST", &lease, &headers, ask("c")).await),
        0,
        "both leases are still counted: max_outstanding is 10"
    );
}

/// How many times each key was answered 200.
fn counted(answers: &[Answered]) -> HashMap<String, u64> {
    let mut counted = HashMap::new();
    for answer in answers.iter().filter(|a| a.status == 200) {
        *counted.entry(answer.key.clone()).or_default() += 1;
    }
    counted
}

/// Each key's count as the server finds it now: one more decision each, less one.
async fn counts_found(server: &str, keys: impl Iterator<Item = &String>) -> HashMap<String, u64> {
    let http = Http::http1();
    let mut found = HashMap::new();
    for key in keys {
        let (status, remaining) = decide(&http, server, &one_check("load", key, COUNTING)).await;
        assert_eq!(status, 200, "{key}");
        let remaining = remaining.unwrap_or_else(|| panic!("{key}: no remaining"));
        found.insert(key.clone(), COUNTING_LIMIT - remaining - 1);
    }
    found
}

/// `redis-cli --cluster reshard` moving a third of the slots while callers decide: none of
/// them is failed, and no count is lost or counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_under_load_fails_no_request_and_keeps_every_count() {
    clear_of_the_counting_window_end();
    let cluster = RedisCluster::start().unwrap();
    // Redirections and counts are what this tests, not latency: in full test runs on two
    // cores, every key's calls (not only the moving slots') were seen to stall together for
    // about half a second during the reshard, 16 of 14,902 decisions past the default 100 ms,
    // four in a row from each caller.
    let running = common::server(Topology::Cluster(cluster.urls()), |c| {
        c.redis_timeout = Duration::from_secs(1);
    })
    .await;
    let server = running.url();
    let (tasks, keys) = (4, 100);
    let (from, to) = (0, 1);
    let before = cluster.slot_owners().unwrap();

    let load = Load::start(&server, "load", COUNTING, tasks, keys);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let said = tokio::task::block_in_place(|| cluster.reshard(from, to, 2000)).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answers = load.stop().await;

    let after = cluster.slot_owners().unwrap();
    let moved = load_keys(tasks, keys)
        .map(|key| load_key(&key))
        .filter(|key| before.owner_of_key(key) == Some(from) && after.owner_of_key(key) == Some(to))
        .count();
    assert!(moved > 0, "no key of the load moved:\n{said}");
    eprintln!(
        "{} requests while 2000 slots moved, {moved} of the load's {} keys with them",
        answers.len(),
        tasks * keys
    );
    let failed: Vec<_> = answers.iter().filter(|a| a.status != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}",
        failed.len(),
        answers.len(),
        &failed[..failed.len().min(5)]
    );
    let counted = counted(&answers);
    assert_eq!(counts_found(&server, counted.keys()).await, counted);
}

/// A primary crashing under load, with Redis' defaults: its replica takes over and the server
/// follows it without a restart. While the cluster counts the primary failed and no replica
/// has taken over, every node refuses every key (`CLUSTERDOWN`: Redis wants all slots
/// covered), so any request may fail then; none fails a second after the replica took over.
/// The counts the primary had replicated are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_primary_is_followed_to_its_replica() {
    assert_followed_to_replica(&[], Failing::AnyKeyUntilReplaced).await;
}

/// As above, with `cluster-require-full-coverage no`: the other primaries keep serving their
/// keys throughout, so only the lost primary's keys ever fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_full_coverage_a_crashed_primary_fails_only_its_own_keys() {
    assert_followed_to_replica(
        &["--cluster-require-full-coverage", "no"],
        Failing::OnlyTheLostPrimarysKeys,
    )
    .await;
}

/// Which requests a crashed primary may fail before its replica takes over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failing {
    AnyKeyUntilReplaced,
    OnlyTheLostPrimarysKeys,
}

async fn assert_followed_to_replica(node_args: &[&str], failing: Failing) {
    clear_of_the_counting_window_end();
    let mut cluster = RedisCluster::start_with_replicas(node_args).unwrap();
    // Which keys fail is what this tests, not latency: on two busy cores, a key of a primary
    // that stayed up was seen past the default 100 ms (503, 580 ms after the crash).
    let running = common::server(Topology::Cluster(cluster.urls()), |c| {
        c.redis_timeout = Duration::from_secs(1);
    })
    .await;
    let server = running.url();
    let (tasks, keys) = (4, 50);
    let load = Load::start(&server, "load", COUNTING, tasks, keys);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Counts the replica has are kept; one written in the last instant before a crash may
    // not have reached it (replication is asynchronous). Stop and let it catch up.
    let before = load.stop().await;
    assert!(before.iter().all(|a| a.status == 200));
    let replicated = counted(&before);
    let owners = cluster.slot_owners().unwrap();
    let owner = |key: &str| owners.owner_of_key(&load_key(key));
    let lost = owner("k0-0").unwrap();
    let lost_keys: Vec<String> = load_keys(tasks, keys)
        .filter(|key| owner(key) == Some(lost))
        .collect();
    let synced = cluster.nodes()[lost].cli(&["WAIT", "1", "2000"]).unwrap();
    assert_eq!(synced.trim(), "1", "the replica caught up");

    let load = Load::start(&server, "load", COUNTING, tasks, keys);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let crashed = Instant::now();
    let replica = tokio::task::block_in_place(|| cluster.crash_and_fail_over(lost)).unwrap();
    let replaced = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = load.stop().await;
    let answered = counted(&during);
    assert_ne!(replica, lost);

    let failed: Vec<_> = during.iter().filter(|a| a.status != 200).collect();
    eprintln!(
        "{node_args:?}: the replica took over {:?} after the crash; {} of {} requests failed, \
         the last sent {:?} after the crash",
        replaced - crashed,
        failed.len(),
        during.len(),
        failed.iter().map(|a| a.sent - crashed).max()
    );
    let settled = replaced + Duration::from_secs(1);
    for Answered { sent, key, status } in &failed {
        assert!(
            *sent < settled,
            "{key} got {status} {:?} after the replica took over",
            *sent - replaced
        );
        assert!(
            lost_keys.contains(key)
                || (failing == Failing::AnyKeyUntilReplaced && *sent < replaced),
            "{key}, on a primary that stayed up, got {status} {:?} after the crash",
            *sent - crashed
        );
    }
    let asked_after = during
        .iter()
        .filter(|a| a.sent > settled && lost_keys.contains(&a.key))
        .count();
    assert!(
        asked_after > 0,
        "no key of the lost primary was asked after"
    );

    // A key of the lost primary keeps at least what its replica had when the first load
    // stopped; it may lose what the primary took in its last instant before the crash, and
    // it may have counted a request that failed: one Redis ran, whose answer came too late.
    let found = counts_found(&server, replicated.keys()).await;
    for (key, &before) in &replicated {
        let total = before + answered.get(key).copied().unwrap_or(0);
        if lost_keys.contains(key) {
            let failed = failed.iter().filter(|a| a.key == *key).count() as u64;
            assert!(
                (before..=total + failed).contains(&found[key]),
                "{key}: counted {}, outside {before} ..= {total} answered + {failed} failed",
                found[key]
            );
        } else {
            assert_eq!(found[key], total, "{key}, on a primary that stayed up");
        }
    }
}

/// A primary whose host vanishes without a word (a partition, its address given up), and is
/// then failed over to its replica: the server's connection to it is left open and silent,
/// and nothing on it fails, so nothing tells the Redis client to look at the slots again. The
/// server opens a new cluster connection once the primary's keys have had no answer for a
/// while, and finds the replica there. Clients reach the primary through a proxy it announces,
/// which goes silent as the host would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_gone_silent_and_failed_over_is_found_at_its_replica() {
    clear_of_the_counting_window_end();
    let mut cluster =
        RedisCluster::start_with_replicas(&["--cluster-require-full-coverage", "no"]).unwrap();
    let key = state_key("r", "k", COUNTING);
    let lost = cluster.owner_of_slot(key_slot(&key)).unwrap();
    let proxy = ForwardingProxy::start(cluster.nodes()[lost].addr()).unwrap();
    let others = cluster.reached_through(lost, &proxy).unwrap();
    let timeout = Duration::from_millis(200);
    let running = common::server(Topology::Cluster(others), |c| c.redis_timeout = timeout).await;
    let (server, http, body) = (running.url(), Http::http1(), one_check("r", "k", COUNTING));
    assert_eq!(
        decide(&http, &server, &body).await,
        (200, Some(COUNTING_LIMIT - 1))
    );

    proxy.silence();
    assert_eq!(decide(&http, &server, &body).await, (503, None));
    let silenced = Instant::now();
    let replica = tokio::task::block_in_place(|| cluster.crash_and_fail_over(lost)).unwrap();
    assert_ne!(replica, lost);
    let failed_over = Instant::now();
    let mut failed = 0;
    let recovered = loop {
        let (status, _) = decide(&http, &server, &body).await;
        if status == 200 {
            break Some(Instant::now());
        }
        failed += 1;
        if failed_over.elapsed() > Duration::from_secs(15) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let recovered = recovered.expect("the key's decisions never recovered at the replica");
    eprintln!(
        "the replica took over {:?} after the connection went silent; decisions recovered {:?} after that ({failed} failed)",
        failed_over - silenced,
        recovered - failed_over
    );
    assert!(
        recovered - silenced < Store::silent_after(timeout) + Duration::from_secs(2)
            || recovered - failed_over < Duration::from_secs(2),
        "decisions recovered {:?} after the connection went silent, {:?} after the failover",
        recovered - silenced,
        recovered - failed_over
    );
}
