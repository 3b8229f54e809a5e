//! The `sluice-server` binary: settings from flags or `SLUICE_*` variables, JSON logs (failures
//! written once a second, not once a request), a graceful exit on SIGTERM, and busy polling
//! that stops when the load does.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::Http;
use common::load::Load;
use common::process::{BINARY, ServerProcess, assert_refused, decide_once};
use futures::future::join_all;
use sluice_harness::{RedisCluster, RedisServer, cpu, key_slot};

#[test]
fn every_setting_is_a_flag_and_an_environment_variable() {
    let help = Command::new(BINARY).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for (flag, variable) in [
        ("--listen", "SLUICE_LISTEN"),
        ("--redis", "SLUICE_REDIS"),
        ("--redis-cluster", "SLUICE_REDIS_CLUSTER"),
        ("--redis-sentinel", "SLUICE_REDIS_SENTINEL"),
        ("--sentinel-master", "SLUICE_SENTINEL_MASTER"),
        ("--redis-password", "SLUICE_REDIS_PASSWORD"),
        ("--redis-username", "SLUICE_REDIS_USERNAME"),
        ("--redis-ca-cert", "SLUICE_REDIS_CA_CERT"),
        ("--redis-client-cert", "SLUICE_REDIS_CLIENT_CERT"),
        ("--redis-client-key", "SLUICE_REDIS_CLIENT_KEY"),
        ("--redis-timeout", "SLUICE_REDIS_TIMEOUT"),
        ("--key-prefix", "SLUICE_KEY_PREFIX"),
        ("--token", "SLUICE_TOKEN"),
        ("--metrics-need-token", "SLUICE_METRICS_NEED_TOKEN"),
        ("--replay-time", "SLUICE_REPLAY_TIME"),
        ("--log-format", "SLUICE_LOG_FORMAT"),
        ("--log", "SLUICE_LOG"),
        ("--shutdown-grace", "SLUICE_SHUTDOWN_GRACE"),
        ("--rls-config", "SLUICE_RLS_CONFIG"),
        ("--rlqs-config", "SLUICE_RLQS_CONFIG"),
        (
            "--rlqs-max-buckets-per-stream",
            "SLUICE_RLQS_MAX_BUCKETS_PER_STREAM",
        ),
        ("--rlqs-max-buckets", "SLUICE_RLQS_MAX_BUCKETS"),
        ("--rls-reload-every", "SLUICE_RLS_RELOAD_EVERY"),
        ("--rls-response-headers", "SLUICE_RLS_RESPONSE_HEADERS"),
        ("--rls-local-cache", "SLUICE_RLS_LOCAL_CACHE"),
        ("--grpc-listen", "SLUICE_GRPC_LISTEN"),
    ] {
        assert!(
            help.contains(flag) && help.contains(&format!("env: {variable}")),
            "{flag} / {variable} missing from --help:\n{help}"
        );
    }
}

/// clap writes a variable's value into `--help` unless told not to, and a Redis URL may hold a
/// password.
#[test]
fn help_never_shows_a_secret_set_in_the_environment() {
    let help = Command::new(BINARY)
        .arg("--help")
        .env("SLUICE_REDIS", "redis://:secret-standalone@127.0.0.1:6379")
        .env(
            "SLUICE_REDIS_CLUSTER",
            "redis://:secret-cluster@127.0.0.1:7000",
        )
        .env(
            "SLUICE_REDIS_SENTINEL",
            "redis://:secret-sentinel@127.0.0.1:26379",
        )
        .env("SLUICE_REDIS_PASSWORD", "secret-password")
        .env("SLUICE_TOKEN", "secret-token")
        .output()
        .unwrap();
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("env: SLUICE_REDIS]"), "{help}");
    assert!(!help.contains("secret"), "--help shows a secret:\n{help}");
}

#[test]
fn a_bad_rate_limit_configuration_stops_the_server_naming_the_file_the_path_and_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("edge.yaml");
    std::fs::write(
        &file,
        "domain: edge\ndescriptors:\n  - key: k\n    share_threshold: true\n",
    )
    .unwrap();
    let output = Command::new(BINARY)
        .args(["--listen", "127.0.0.1:0", "--rls-config"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "--rls-config: {}: descriptors[0].share_threshold: unknown field `share_threshold`",
            file.display()
        )),
        "{stderr}"
    );
}

#[test]
fn a_bad_setting_stops_the_server_with_a_message_naming_it() {
    let output = Command::new(BINARY)
        .env("SLUICE_KEY_PREFIX", "a{b}")
        .env("SLUICE_LISTEN", "127.0.0.1:0")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--key-prefix: `a{b}` must be non-empty and without braces"),
        "{stderr}"
    );
    assert_refused(&["--redis-timeout", "soon"], "`soon` is not a duration");
    assert_refused(
        &["--redis-timeout", "40s"],
        "--request-timeout (30s) must be longer than --redis-timeout (40s)",
    );
    assert_refused(
        &["--log", "info,redis=loud"],
        "invalid value 'info,redis=loud' for '--log <LOG>'",
    );
    assert_refused(
        &["--redis", "htp://user:hunter2@redis:6379"],
        "--redis: `htp://user:***@redis:6379` is not a Redis URL",
    );
    assert_refused(
        &["--grpc-listen", "127.0.0.1:0"],
        "--grpc-listen: serves the gRPC APIs, and needs --rls-config or --rlqs-config",
    );
    let dir = tempfile::tempdir().unwrap();
    let quotas = dir.path().join("edge.yaml");
    std::fs::write(
        &quotas,
        "domain: edge\nbuckets:\n  - match: {key: \"*\"}\n    limit: {algorithm: gcra, rate: 10, per: 1s}\n",
    )
    .unwrap();
    assert_refused(
        &["--rlqs-config", quotas.to_str().unwrap()],
        &format!(
            "--rlqs-config: {}: buckets[0].limit: algorithm `gcra` needs `burst`",
            quotas.display()
        ),
    );
}

/// With `--busy-poll-us` the server polls instead of sleeping while decisions come (and says
/// how long in its metrics), and sleeps once they stop: idle, it spends next to no CPU. A
/// poller that never stopped would spend the whole second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_polling_server_polls_under_load_and_sleeps_when_idle() {
    busy_polling_polls_under_load_and_sleeps_when_idle("1").await;
}

/// As above, with two threads, each polling its own event loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_thread_of_a_busy_polling_server_sleeps_when_idle() {
    busy_polling_polls_under_load_and_sleeps_when_idle("2").await;
}

async fn busy_polling_polls_under_load_and_sleeps_when_idle(threads: &str) {
    let redis = RedisServer::start().unwrap();
    let mut child = ServerProcess::start(Command::new(BINARY).args([
        "--listen",
        "127.0.0.1:0",
        "--redis",
        &redis.url(),
        "--threads",
        threads,
        "--busy-poll-us",
        "200",
    ]));
    let port = child.port().await;
    assert_eq!(decide_once(port).await.status, 200);
    let url = format!("http://127.0.0.1:{port}");
    let limit = r#"{"algorithm":"gcra","rate":1000000,"per":"1s","burst":1000000}"#;
    let load = Load::start(&url, "busy", limit, 4, 100);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let answers = load.stop().await;
    assert!(answers.len() > 100, "{} decisions", answers.len());
    assert!(answers.iter().all(|a| a.status == 200));
    let polled = |metrics: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("sluice_busy_poll_seconds_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no busy poll counter in\n{metrics}"))
    };
    let metrics = Http::http1().get(&format!("{url}/metrics")).await.body;
    assert!(polled(&metrics) > 0.0, "{metrics}");

    // Let the last poll run out, then watch an idle second.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = cpu::process(child.id()).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = cpu::process(child.id()).unwrap() - before;
    assert!(idle <= 0.1, "{idle} s of CPU in an idle second");
    child.stop().await;
}

/// With several threads, each serves connections on its own socket of the one port, and the
/// metrics count every thread's decisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_threads_share_the_port_the_load_and_the_metrics() {
    let redis = RedisServer::start().unwrap();
    let mut child = ServerProcess::start(Command::new(BINARY).args([
        "--listen",
        "127.0.0.1:0",
        "--redis",
        &redis.url(),
        "--threads",
        "2",
    ]));
    let port = child.port().await;
    assert_eq!(decide_once(port).await.status, 200);
    let url = format!("http://127.0.0.1:{port}");
    let limit = r#"{"algorithm":"gcra","rate":1000000,"per":"1s","burst":1000000}"#;
    // Connections the kernel spreads over the two sockets by their ports.
    let load = Load::start(&url, "spread", limit, 16, 100);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let answers = load.stop().await;
    assert!(answers.iter().all(|a| a.status == 200));
    let metrics = Http::http1().get(&format!("{url}/metrics")).await.body;
    let counted: usize = metrics
        .lines()
        .filter(|l| l.starts_with("sluice_decisions_total{") && l.contains("rule=\"spread\""))
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<usize>().ok())
        .sum();
    assert_eq!(counted, answers.len(), "{metrics}");
    let busy_threads = std::fs::read_dir(format!("/proc/{}/task", child.id()))
        .unwrap()
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("stat")).ok()?;
            let (_, after) = stat.split_once(") ")?;
            let name = stat.split_once('(')?.1.split_once(')')?.0.to_owned();
            let fields: Vec<&str> = after.split_whitespace().collect();
            let ticks: u64 =
                fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
            name.starts_with("sluice-server").then_some(ticks)
        })
        .filter(|ticks| *ticks > 0)
        .count();
    assert_eq!(busy_threads, 2, "both serving threads worked");
    child.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_from_the_environment_it_serves_logs_json_and_exits_cleanly_on_sigterm() {
    let redis = RedisServer::start().unwrap();
    let mut child = ServerProcess::start(
        Command::new(BINARY)
            .env("SLUICE_LISTEN", "127.0.0.1:0")
            .env("SLUICE_REDIS", redis.url())
            .env("SLUICE_LOG_FORMAT", "json")
            .env("SLUICE_REDIS_TIMEOUT", "250ms"),
    );
    let port = child.port().await;
    let answer = decide_once(port).await;
    assert_eq!(answer.status, 200);

    let lines = child.stop().await;
    assert!(!lines.is_empty());
    for line in &lines {
        let parsed: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            parsed.get("level").is_some() && parsed.get("fields").is_some(),
            "{line}"
        );
    }
    assert!(
        lines.iter().any(|l| l.contains("shutting down")),
        "{lines:?}"
    );
}

/// While Redis is down every decision fails: the log says so once a second, with how many
/// failures it left out, not once a request (the metrics count each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_down_failures_are_logged_once_a_second_not_once_a_request() {
    let mut redis = RedisServer::start().unwrap();
    let mut child = ServerProcess::start(
        Command::new(BINARY)
            .args(["--listen", "127.0.0.1:0"])
            .args(["--redis", &redis.url(), "--log-format", "json"]),
    );
    let port = child.port().await;
    assert_eq!(decide_once(port).await.status, 200);
    redis.kill();
    let url = format!("http://127.0.0.1:{port}");
    let limit = r#"{"algorithm":"gcra","rate":1,"per":"1s","burst":1}"#;
    let started = Instant::now();
    let callers = (0..8).map(|caller| {
        let url = url.clone();
        tokio::spawn(async move {
            let http = Http::http1();
            let mut failed = 0u64;
            for i in 0..25 {
                let body = common::one_check("r", &format!("k{caller}-{i}"), limit);
                let answer = http.decide(&url, &body, &[]).await;
                assert_eq!(answer.status, 503, "{}", answer.body);
                failed += 1;
            }
            failed
        })
    });
    let failed: u64 = join_all(callers)
        .await
        .into_iter()
        .map(Result::unwrap)
        .sum();
    let seconds = started.elapsed().as_secs();
    let lines = child.stop().await;
    let warnings: Vec<serde_json::Value> = lines
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["fields"]["message"] == "decision failed")
        .collect();
    eprintln!("{failed} failed in {seconds} s: {} lines", warnings.len());
    assert!(
        (1..=seconds + 1).contains(&(warnings.len() as u64)),
        "{} warnings for {failed} failures in {seconds} s: {warnings:#?}",
        warnings.len()
    );
    let left_out: u64 = warnings
        .iter()
        .map(|w| w["fields"]["left_out"].as_u64().unwrap())
        .sum();
    assert!(left_out + warnings.len() as u64 <= failed);
}

/// The Redis client warns of every slot refresh and every failed connection attempt, thousands
/// a second while a Cluster is resharded or fails over: by default its lines are left out
/// (the server's own say what failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_the_redis_clients_own_warnings_are_left_out() {
    let cluster = RedisCluster::start().unwrap();
    let mut child = ServerProcess::start(
        Command::new(BINARY)
            .args(["--listen", "127.0.0.1:0"])
            .args(["--redis-cluster", &cluster.urls().join(",")])
            .args(["--log-format", "json"]),
    );
    let port = child.port().await;
    assert_eq!(decide_once(port).await.status, 200);
    // decide_once's key, as the server keeps it: moved, so that the client meets MOVED and
    // refreshes its slots, which it warns of.
    let slot = key_slot("sluice:{r:k}:gc");
    let to = (cluster.owner_of_slot(slot).unwrap() + 1) % cluster.nodes().len();
    let moving = cluster.begin_slot_move(slot, to).unwrap();
    assert_eq!(moving.migrate_keys().unwrap(), 1);
    moving.finish().unwrap();
    assert_eq!(decide_once(port).await.status, 200);
    let lines = child.stop().await;
    let client_lines: Vec<&String> = lines
        .iter()
        .filter(|line| line.contains(r#""target":"redis"#))
        .collect();
    assert!(client_lines.is_empty(), "{client_lines:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_succeed_from_the_moment_the_server_says_it_is_connected() {
    // A Redis 100 ms away each way: loading the functions library takes a round trip, during
    // which the server used to refuse decisions as "not connected yet" after logging that it
    // was connected. With two threads, each with its own connection, it used to say so when
    // the first was up, and requests on the other thread failed (seen under load in CI's
    // test run, 2026-11-26).
    let redis = RedisServer::start().unwrap();
    let proxy =
        sluice_harness::ForwardingProxy::with_latency(redis.addr(), Duration::from_millis(100))
            .unwrap();
    let mut child = ServerProcess::start(
        Command::new(BINARY)
            .args(["--listen", "127.0.0.1:0"])
            .args(["--redis", &proxy.redis_url(), "--redis-timeout", "2s"])
            .args(["--threads", "2"])
            .stdout(std::process::Stdio::null()),
    );
    let port = child.port().await;
    child.wait_for("connected to redis").await;
    let http = Http::http1();
    let url = format!("http://127.0.0.1:{port}");
    let limit = r#"{"algorithm":"gcra","rate":100,"per":"1s","burst":100}"#;
    let answers = join_all((0..4).map(|i| {
        let (http, url) = (&http, &url);
        async move {
            http.decide(url, &common::one_check("r", &format!("k{i}"), limit), &[])
                .await
        }
    }))
    .await;
    drop(child);
    for answer in answers {
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
}
