//! The `sluice-server` binary: settings from flags or `SLUICE_*` variables, JSON logs, and a
//! graceful exit on SIGTERM.

use crate::common;

use std::process::Command;

use common::process::{BINARY, ServerProcess, decide_once};
use sluice_harness::{RedisServer, free_port};

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
        ("--replay-time", "SLUICE_REPLAY_TIME"),
        ("--log-format", "SLUICE_LOG_FORMAT"),
        ("--log", "SLUICE_LOG"),
        ("--shutdown-grace", "SLUICE_SHUTDOWN_GRACE"),
        ("--rls-config", "SLUICE_RLS_CONFIG"),
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
    let output = Command::new(BINARY)
        .args(["--redis-timeout", "soon"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("`soon` is not a duration"));
    let output = Command::new(BINARY)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--redis",
            "htp://user:hunter2@redis:6379",
        ])
        .output()
        .unwrap();
    assert!(
        !output.status.success(),
        "a bad Redis URL is refused at once"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--redis: `htp://user:***@redis:6379` is not a Redis URL"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_from_the_environment_it_serves_logs_json_and_exits_cleanly_on_sigterm() {
    let redis = RedisServer::start().unwrap();
    let port = free_port().unwrap();
    let child = ServerProcess::start(
        Command::new(BINARY)
            .env("SLUICE_LISTEN", format!("127.0.0.1:{port}"))
            .env("SLUICE_REDIS", redis.url())
            .env("SLUICE_LOG_FORMAT", "json")
            .env("SLUICE_REDIS_TIMEOUT", "250ms"),
    );
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
