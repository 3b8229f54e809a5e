//! The `sluice-server` binary: settings from flags or `SLUICE_*` variables, JSON logs, and a
//! graceful exit on SIGTERM.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Http;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use sluice_harness::{RedisServer, free_port};

const BINARY: &str = env!("CARGO_BIN_EXE_sluice-server");

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
async fn a_password_in_the_redis_url_authenticates_and_never_reaches_the_logs() {
    let redis = RedisServer::start().unwrap();
    redis
        .cli(&["CONFIG", "SET", "requirepass", "hunter2"])
        .unwrap();
    let port = free_port().unwrap();
    let mut child = Command::new(BINARY)
        .args(["--listen", &format!("127.0.0.1:{port}"), "--log", "debug"])
        .args([
            "--redis",
            &format!("redis://:hunter2@127.0.0.1:{}", redis.port()),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let answer = decide_once(port).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let lines = stop(&mut child).await;
    assert!(
        lines.iter().any(|l| l.contains(":***@127.0.0.1")),
        "the topology is logged: {lines:?}"
    );
    assert!(!lines.iter().any(|l| l.contains("hunter2")), "{lines:?}");
}

/// A certificate authority, a certificate for Redis on 127.0.0.1 and one for its client, each
/// a PEM file (`ca.crt`, `redis.crt` and `redis.key`, `client.crt` and `client.key`) in the
/// directory it keeps.
struct Certificates(tempfile::TempDir);

impl Certificates {
    fn make() -> Certificates {
        let dir = tempfile::tempdir().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // Each its own name: OpenSSL takes a certificate named as its issuer for self-signed.
        ca.distinguished_name
            .push(DnType::CommonName, "sluice test authority");
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.path().join("ca.crt"), ca.pem()).unwrap();
        for (name, names) in [("redis", vec!["127.0.0.1"]), ("client", vec!["sluice"])] {
            let key = KeyPair::generate().unwrap();
            let names: Vec<String> = names.into_iter().map(str::to_owned).collect();
            let mut params = CertificateParams::new(names).unwrap();
            params.distinguished_name.push(DnType::CommonName, name);
            let certificate = params.signed_by(&key, &ca).unwrap();
            let path = dir.path().join(name);
            std::fs::write(path.with_extension("crt"), certificate.pem()).unwrap();
            std::fs::write(path.with_extension("key"), key.serialize_pem()).unwrap();
        }
        Certificates(dir)
    }

    fn path(&self, file: &str) -> String {
        self.0.path().join(file).display().to_string()
    }

    /// A Redis answering TLS on the port it returns, verifying its clients (Redis' default),
    /// and plain TCP on its usual port.
    fn redis(&self) -> (RedisServer, u16) {
        let port = free_port().unwrap();
        let redis = RedisServer::start_with(&[
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &self.path("redis.crt"),
            "--tls-key-file",
            &self.path("redis.key"),
            "--tls-ca-cert-file",
            &self.path("ca.crt"),
        ])
        .unwrap();
        (redis, port)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_it_trusts_the_authority_given_and_presents_its_certificate() {
    let certificates = Certificates::make();
    let (redis, tls_port) = certificates.redis();
    let port = free_port().unwrap();
    let mut child = Command::new(BINARY)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--redis", &format!("rediss://127.0.0.1:{tls_port}")])
        .args(["--redis-ca-cert", &certificates.path("ca.crt")])
        .args(["--redis-client-cert", &certificates.path("client.crt")])
        .args(["--redis-client-key", &certificates.path("client.key")])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let answer = decide_once(port).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    stop(&mut child).await;
    // The decision's key is in the Redis behind the TLS port.
    let keys = redis.cli(&["--scan"]).unwrap();
    assert!(keys.contains("sluice:"), "keys: {keys}");

    // Without its certificate the server is refused, and not ready.
    let port = free_port().unwrap();
    let mut child = Command::new(BINARY)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--redis", &format!("rediss://127.0.0.1:{tls_port}")])
        .args(["--redis-ca-cert", &certificates.path("ca.crt")])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let http = Http::http1();
    let mut statuses = Vec::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(answer) = http
            .try_send("GET", &format!("http://127.0.0.1:{port}/readyz"), &[], "")
            .await
        {
            statuses.push(answer.status);
        }
    }
    let lines = stop(&mut child).await;
    assert!(
        !statuses.is_empty() && statuses.iter().all(|s| *s == 503),
        "{statuses:?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("redis unreachable")),
        "{lines:?}"
    );
}

#[test]
fn tls_settings_are_checked_at_start_up() {
    let certificates = Certificates::make();
    let refused = |args: &[&str]| {
        let output = Command::new(BINARY)
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?} was taken");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let ca = certificates.path("ca.crt");
    let key = certificates.path("client.key");
    let stderr = refused(&["--redis", "redis://127.0.0.1:6379", "--redis-ca-cert", &ca]);
    assert!(
        stderr
            .contains("--redis-ca-cert: certificates for TLS, but --redis gives no rediss:// URL"),
        "{stderr}"
    );
    let stderr = refused(&[
        "--redis",
        "rediss://127.0.0.1:6379",
        "--redis-ca-cert",
        &key,
    ]);
    assert!(
        stderr.contains(&format!("--redis-ca-cert: {key}: no PEM certificate in it")),
        "{stderr}"
    );
    let missing = certificates.path("nothing.crt");
    let stderr = refused(&[
        "--redis",
        "rediss://127.0.0.1:6379",
        "--redis-ca-cert",
        &missing,
    ]);
    assert!(
        stderr.contains(&format!("--redis-ca-cert: {missing}: ")),
        "{stderr}"
    );
    let stderr = refused(&[
        "--redis",
        "rediss://127.0.0.1:6379",
        "--redis-client-cert",
        &certificates.path("client.crt"),
        "--redis-client-key",
        &ca,
    ]);
    assert!(
        stderr.contains(&format!("--redis-client-key: {ca}: ")),
        "{stderr}"
    );
}

/// Waits up to 5 s for the server on `port` to be ready, and asks it one decision.
async fn decide_once(port: u16) -> common::Answer {
    let url = format!("http://127.0.0.1:{port}");
    let http = Http::http1();
    let mut ready = false;
    for _ in 0..200 {
        if let Ok(Ok(answer)) = tokio::time::timeout(
            Duration::from_millis(200),
            http.try_send("GET", &format!("{url}/readyz"), &[], ""),
        )
        .await
            && answer.status == 200
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(ready, "the server never became ready");
    let limit = r#"{"algorithm":"gcra","rate":1,"per":"1s","burst":1}"#;
    http.decide(&url, &common::one_check("r", "k", limit), &[])
        .await
}

/// Stops `child` by SIGTERM; its exit must be clean. What it wrote to stderr, by line.
async fn stop(child: &mut std::process::Child) -> Vec<String> {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let stderr = child.stderr.take().unwrap();
    let lines: Vec<String> = tokio::task::spawn_blocking(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect()
    })
    .await
    .unwrap();
    let exit = child.wait().unwrap();
    assert!(exit.success(), "exit {exit:?}");
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_from_the_environment_it_serves_logs_json_and_exits_cleanly_on_sigterm() {
    let redis = RedisServer::start().unwrap();
    let port = free_port().unwrap();
    let mut child = Command::new(BINARY)
        .env("SLUICE_LISTEN", format!("127.0.0.1:{port}"))
        .env("SLUICE_REDIS", redis.url())
        .env("SLUICE_LOG_FORMAT", "json")
        .env("SLUICE_REDIS_TIMEOUT", "250ms")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let answer = decide_once(port).await;
    assert_eq!(answer.status, 200);

    let lines = stop(&mut child).await;
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
