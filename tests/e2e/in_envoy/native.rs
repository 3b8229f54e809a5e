//! Envoy's native `envoy.filters.http.ratelimit` filter asking sluice-server's gRPC API, in a
//! real Envoy with two workers: the route actions of `envoy/envoy-ratelimit.yaml` each limited
//! by their descriptor, `failure_mode_deny`, and TLS between Envoy and sluice-server.

use std::path::Path;
use std::time::{Duration, Instant};

use sluice_e2e::real_envoy::{Backends, MutualTls, get};
use sluice_harness::Envoy;

use super::filter::WORKERS;

/// The reference service's format, with the descriptors the shipped config's actions send.
const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: api_key
    rate_limit:
      unit: minute
      requests_per_unit: 3
      sluice: {algorithm: sliding_window, limit: 3, window: 1m}
  - key: api_key
    value: internal-batch
    rate_limit: {unlimited: true}
"#;

/// A directory with [`LIMITS`], and Redis and sluice-server reading it, with `server_args`.
fn backends_with_limits(dir: &Path, server_args: &[&str]) -> Backends {
    let rls = dir.join("ratelimit");
    std::fs::create_dir_all(&rls).expect("a directory");
    std::fs::write(rls.join("edge.yaml"), LIMITS).expect("the limits");
    let mut args = vec!["--rls-config", rls.to_str().expect("UTF-8")];
    args.extend_from_slice(server_args);
    Backends::start(&args)
}

/// `envoy/envoy-ratelimit.yaml` pointed at `backends`.
fn shipped_ratelimit_config(backends: &Backends) -> String {
    super::shipped::pointed_at("envoy-ratelimit.yaml", backends)
}

#[test]
fn each_route_action_is_limited_by_its_own_descriptor() {
    let dir = tempfile::tempdir().expect("a directory");
    let backends = backends_with_limits(dir.path(), &[]);
    let envoy = Envoy::start(&shipped_ratelimit_config(&backends), WORKERS).expect("Envoy");
    let statuses = |key: &str, n: usize| -> Vec<u16> {
        (0..n)
            .map(|_| get(&envoy, "/api/orders", &[("x-api-key", key)]).status)
            .collect()
    };
    // /api/ sends (remote_address) and (api_key): the key's 3 a minute binds.
    assert_eq!(statuses("k1", 4), [200, 200, 200, 429]);
    assert_eq!(
        statuses("k2", 2),
        [200, 200],
        "another key has its own limit"
    );
    assert_eq!(statuses("internal-batch", 6), [200; 6], "unlimited");
    // Outside /api/ only the client's address counts, 15 of its 100 spent so far.
    assert_eq!(get(&envoy, "/", &[("x-api-key", "k1")]).status, 200);
    let over_limit = envoy
        .stat("cluster.upstream.ratelimit.over_limit")
        .expect("stats");
    assert_eq!(over_limit, 1);
    let limited = get(&envoy, "/api/x", &[("x-api-key", "k1")]);
    assert_eq!(limited.status, 429);
    assert_eq!(
        limited
            .header("x-ratelimit-limit")
            .map(|v| v.split(',').next()),
        Some(Some("3"))
    );
}

#[test]
fn failure_mode_deny_refuses_requests_while_sluice_server_is_down() {
    let dir = tempfile::tempdir().expect("a directory");
    let mut backends = backends_with_limits(dir.path(), &[]);
    let config = shipped_ratelimit_config(&backends)
        .replace("failure_mode_deny: false", "failure_mode_deny: true");
    assert!(config.contains("failure_mode_deny: true"));
    let envoy = Envoy::start(&config, WORKERS).expect("Envoy");
    assert_eq!(get(&envoy, "/", &[]).status, 200);
    backends.stop_server();
    for _ in 0..4 {
        let started = Instant::now();
        let answer = get(&envoy, "/", &[]);
        assert_eq!(answer.status, 500, "{answer:?}");
        assert!(started.elapsed() < Duration::from_millis(800));
    }
    assert!(
        envoy
            .stat("cluster.upstream.ratelimit.failure_mode_allowed")
            .expect("stats")
            == 0
    );
    assert!(
        envoy
            .stat("cluster.upstream.ratelimit.error")
            .expect("stats")
            >= 4
    );
    backends.restart_server();
    sluice_e2e::real_envoy::eventually("decisions again", Duration::from_secs(10), || {
        get(&envoy, "/", &[]).status == 200
    });
}

#[test]
fn envoy_reaches_sluice_server_over_tls_with_a_client_certificate() {
    let dir = tempfile::tempdir().expect("a directory");
    let tls = MutualTls::new();
    let server_args = tls.server_args();
    let args: Vec<&str> = server_args.iter().map(String::as_str).collect();
    let backends = backends_with_limits(dir.path(), &args);
    let config = tls.on_cluster(&shipped_ratelimit_config(&backends), "sluice_rls");
    let envoy = Envoy::start(&config, WORKERS).expect("Envoy");
    let statuses: Vec<u16> = (0..4)
        .map(|_| get(&envoy, "/api/a", &[("x-api-key", "k1")]).status)
        .collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 429],
        "decided by the server, over TLS"
    );
    assert!(
        envoy
            .stat("cluster.sluice_rls.ssl.handshake")
            .expect("stats")
            >= 1
    );
    assert_eq!(
        envoy
            .stat("cluster.upstream.ratelimit.error")
            .expect("stats"),
        0
    );
}
