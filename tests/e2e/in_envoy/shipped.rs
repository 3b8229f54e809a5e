//! The Envoy configs shipped in `envoy/`, in a real Envoy 1.40, changed only in their addresses
//! and the .wasm's path (the module's is the search path the harness gives every Envoy): Envoy takes them, their clusters are healthy within seconds of start,
//! and real traffic is limited as `envoy/smoke.sh` checks in the compose workflow.

use std::time::{Duration, Instant};

use sluice_e2e::real_envoy::{
    Backends, any_port, burst, count_status, localize, repo_root, start_envoy,
};
use sluice_harness::http;
use sluice_harness::{Envoy, validate_envoy_config};

/// Every cluster of a shipped config must be healthy this soon after Envoy says it is ready.
const HEALTHY_WITHIN: Duration = Duration::from_secs(3);

fn shipped(name: &str) -> String {
    std::fs::read_to_string(repo_root().join("envoy").join(name)).expect("a shipped config")
}

/// A shipped config pointed at `backends`: the listener and admin on free loopback ports.
pub(super) fn pointed_at(name: &str, backends: &Backends) -> String {
    let wasm = sluice_e2e::filter_wasm_path();
    localize(
        &shipped(name),
        &[
            ("0.0.0.0:10000", any_port()),
            ("127.0.0.1:9901", any_port()),
            ("sluice-server:8080", backends.server_addr()),
            ("echo:5678", backends.upstream.addr()),
        ],
        &[("sluice_filter.wasm", wasm.as_path())],
    )
}

/// `config` with the shipped filter's timeout for sluice-server, `shipped`, made `patient`: the
/// shipped filters give the server 0.1 s, what a release build answers in well under a
/// millisecond; the tests' server is a debug build on a machine the other tests share, and one
/// call of a run has been seen to take longer. Every call still has to be answered.
fn with_patient_timeout(config: &str, shipped: &str, patient: &str) -> String {
    assert!(config.contains(shipped), "the filter's timeout moved");
    config.replace(shipped, patient)
}

/// sluice-server with the shipped descriptors.
fn ratelimit_backends() -> Backends {
    let rls = repo_root().join("envoy/ratelimit");
    Backends::start(&["--rls-config", rls.to_str().expect("a UTF-8 path")])
}

/// The shipped configs and the server flags each needs (the compose files' settings).
fn shipped_configs() -> Vec<(&'static str, Backends)> {
    vec![
        ("envoy.yaml", Backends::start(&[])),
        ("envoy-module.yaml", Backends::start(&[])),
        ("envoy-ratelimit.yaml", ratelimit_backends()),
        (
            "envoy-rlqs.yaml",
            super::rlqs::rlqs_backends(&repo_root().join("envoy/rlqs")),
        ),
    ]
}

#[test]
fn every_shipped_config_passes_envoys_own_validation() {
    let yaml_files: Vec<String> = std::fs::read_dir(repo_root().join("envoy"))
        .expect("envoy/")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    let configs = shipped_configs();
    let names: Vec<&str> = configs.iter().map(|(name, _)| *name).collect();
    for file in &yaml_files {
        assert!(
            names.contains(&file.as_str()),
            "envoy/{file} is an Envoy config no test here runs: add it to shipped_configs"
        );
    }
    for (name, backends) in &configs {
        validate_envoy_config(&pointed_at(name, backends))
            .unwrap_or_else(|e| panic!("envoy/{name}: {e}"));
    }
}

#[test]
fn every_shipped_configs_clusters_are_healthy_within_seconds_of_start() {
    for (name, backends) in shipped_configs() {
        let envoy = Envoy::start(&pointed_at(name, &backends), 2).expect("Envoy starts");
        for cluster in ["sluice", "sluice_rls", "upstream"] {
            if envoy.cluster_health(cluster).expect("/clusters").is_empty() {
                continue;
            }
            envoy
                .wait_healthy(cluster, HEALTHY_WITHIN)
                .unwrap_or_else(|e| panic!("envoy/{name}: {e}"));
        }
    }
}

/// What `envoy/smoke.sh` checks: after a pause, a burst from one client passes at least the
/// policy's burst of 20 and is then limited, the 429s carrying `X-RateLimit-*` (and
/// `Retry-After` where the filter sends it) with no quota left. The burst is sent from several
/// threads, and what passed is held to the algorithm's bound for the time it took: 20 + 10
/// a second (gcra), so a slow machine cannot make the check pass or fail by chance.
fn smoke(envoy: &Envoy, retry_after: bool) -> (usize, usize) {
    let started = Instant::now();
    let answers = burst(envoy, "/", &[], 60, 6);
    let took = started.elapsed().as_secs_f64();
    let passed = count_status(&answers, 200);
    let limited = count_status(&answers, 429);
    assert_eq!(passed + limited, answers.len(), "only 200 and 429");
    assert!(passed >= 20, "{passed} passed, fewer than the burst of 20");
    let bound = 20 + (10.0 * took).ceil() as usize + 1;
    assert!(
        passed <= bound,
        "{passed} passed in {took:.2}s, over gcra's bound of {bound}"
    );
    let denied = answers
        .iter()
        .find(|a| a.status == 429)
        .expect("the burst was not limited");
    let mut expected = vec![
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ];
    if retry_after {
        expected.push("retry-after");
    }
    for name in expected {
        assert!(
            denied.header(name).is_some(),
            "a 429 lacks {name}: {:?}",
            denied.headers
        );
    }
    assert_eq!(
        denied.header("x-ratelimit-remaining"),
        Some("0"),
        "a 429 with quota left: {:?}",
        denied.headers
    );
    (passed, limited)
}

#[test]
fn the_shipped_wasm_config_limits_a_burst_as_the_compose_smoke_test_checks() {
    let backends = Backends::start(&[]);
    let config = pointed_at("envoy.yaml", &backends);
    let config = with_patient_timeout(&config, r#""timeout": "100ms""#, r#""timeout": "3s""#);
    let envoy = Envoy::start(&config, 2).expect("Envoy starts");
    let ingress = envoy.listener("ingress").expect("ingress");
    let first = http::get(ingress, "/", &[]).expect("an answer");
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.text(), sluice_harness::UPSTREAM_BODY);
    std::thread::sleep(Duration::from_secs(3)); // smoke.sh: let the first request's budget refill
    let (passed, limited) = smoke(&envoy, true);
    eprintln!("envoy.yaml: {passed} passed, {limited} limited");
    // Every decision was the server's: none was let through by the failure mode.
    assert_eq!(
        envoy
            .stat("wasmcustom.sluice.callout_failures")
            .expect("stats"),
        0,
        "{}",
        envoy.admin_get("/stats?filter=sluice").unwrap_or_default()
    );
}

#[test]
fn the_shipped_module_config_limits_a_burst_as_the_wasm_config_does() {
    let backends = Backends::start(&[]);
    let config = pointed_at("envoy-module.yaml", &backends);
    let config = with_patient_timeout(&config, r#""timeout": "100ms""#, r#""timeout": "3s""#);
    let envoy = start_envoy(&config, 2);
    let ingress = envoy.listener("ingress").expect("ingress");
    let first = http::get(ingress, "/", &[]).expect("an answer");
    assert_eq!(first.status, 200, "{first:?}");
    std::thread::sleep(Duration::from_secs(3)); // as for envoy.yaml
    let (passed, limited) = smoke(&envoy, true);
    eprintln!("envoy-module.yaml: {passed} passed, {limited} limited");
    assert_eq!(
        envoy
            .stat("dynamicmodulescustom.sluice.callout_failures")
            .expect("stats"),
        0,
        "{}",
        envoy.admin_get("/stats?filter=sluice").unwrap_or_default()
    );
}

#[test]
fn the_shipped_ratelimit_config_limits_a_burst_through_sluice_servers_grpc_api() {
    let backends = ratelimit_backends();
    let config = with_patient_timeout(
        &pointed_at("envoy-ratelimit.yaml", &backends),
        "timeout: 0.1s",
        "timeout: 3s",
    );
    let envoy = Envoy::start(&config, 2).expect("Envoy starts");
    let ingress = envoy.listener("ingress").expect("ingress");
    assert_eq!(http::get(ingress, "/", &[]).expect("an answer").status, 200);
    std::thread::sleep(Duration::from_secs(3));
    // The native filter sends no Retry-After; the X-RateLimit-* headers come from the answer.
    let (passed, limited) = smoke(&envoy, false);
    eprintln!("envoy-ratelimit.yaml: {passed} passed, {limited} limited");
    assert_eq!(
        envoy
            .stat("cluster.upstream.ratelimit.over_limit")
            .expect("stats"),
        limited as u64
    );
    assert_eq!(
        envoy
            .stat("cluster.upstream.ratelimit.error")
            .expect("stats"),
        0
    );
}
