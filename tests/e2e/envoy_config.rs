//! What users load into Envoy, checked statically: every Envoy config in `envoy/` against
//! Envoy's own API (the `xds-protos` descriptors, in the virtualenv `scripts/setup.sh` makes),
//! with a misspelled field named; every sluice policy embedded in `envoy/` against the filter's
//! own configuration check; and the compose file and the workflow that run it. The same
//! configs run in a real Envoy in `in_envoy::shipped`.

use std::process::Command;

use sluice_e2e::real_envoy::repo_root;
use sluice_e2e::{filter_wasm, venv_python};
use sluice_sim::{Simulation, Topology};

/// Runs `scripts/check_envoy.py <args>` with the virtualenv's Python; its stdout, or a panic
/// with its stderr.
fn check_envoy(args: &[&str]) -> String {
    let output = Command::new(venv_python())
        .arg(repo_root().join("scripts/check_envoy.py"))
        .args(args)
        .output()
        .expect("running scripts/check_envoy.py");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "check_envoy.py {}: {}{}",
        args.join(" "),
        stdout,
        stderr
    );
    print!("{stdout}");
    stdout
}

#[test]
fn every_envoy_config_parses_into_a_bootstrap_with_its_typed_configs() {
    let configs: Vec<String> = std::fs::read_dir(repo_root().join("envoy"))
        .expect("envoy/")
        .map(|e| e.expect("an entry of envoy/").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| p.display().to_string())
        .collect();
    assert!(!configs.is_empty(), "no Envoy config in envoy/");
    let args: Vec<&str> = std::iter::once("bootstrap")
        .chain(configs.iter().map(String::as_str))
        .collect();
    let out = check_envoy(&args);
    assert_eq!(out.matches("a valid Bootstrap").count(), configs.len());
    assert!(out.contains("envoy.filters.network.http_connection_manager"));
}

#[test]
fn a_misspelled_field_in_a_copy_of_the_config_is_caught() {
    let out = check_envoy(&[
        "misspelled",
        &repo_root().join("envoy/envoy.yaml").display().to_string(),
    ]);
    // Top level, in a cluster, and inside the wasm filter's typed config.
    for name in [
        "static_resource",
        "conect_timeout",
        "root_idd",
        "failure_polcy",
    ] {
        assert!(out.contains(&format!("`{name}` refused")), "{out}");
    }
}

#[test]
fn the_policies_embedded_in_envoy_pass_the_filters_own_check() {
    let out = check_envoy(&["plugin-configs"]);
    let wasm = filter_wasm();
    let mut sources = Vec::new();
    for line in out.lines() {
        let entry: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let source = entry["source"].as_str().expect("source").to_owned();
        let config = entry["config"].as_str().expect("config");
        // Loaded into the simulator as Envoy would load it: on_configure must accept it.
        let simulation =
            Simulation::new(&wasm, config.as_bytes()).unwrap_or_else(|e| panic!("{source}: {e:#}"));
        simulation
            .envoys(&Topology::default(), 0)
            .unwrap_or_else(|e| panic!("{source}: the filter refused its policy: {e}"));
        sources.push(source);
    }
    for expected in [
        "envoy/envoy.yaml",
        "envoy/istio/wasmplugin.yaml",
        "envoy/gateway/extension-policy.yaml",
    ] {
        assert!(
            sources.iter().any(|s| s == expected),
            "no policy from {expected}: {sources:?}"
        );
    }
}

#[test]
fn a_bad_policy_would_be_refused_by_that_check() {
    // The check above can fail: the same path refuses a policy with a misspelled field.
    let wasm = filter_wasm();
    let bad = r#"{"cluster": "sluice", "rules": [{"name": "r", "key": ["client_ip"],
        "limit": {"algorithm": "gcra", "rate": 10, "pre": "1s"}}]}"#;
    let refused = Simulation::new(&wasm, bad.as_bytes())
        .and_then(|s| Ok(s.envoys(&Topology::default(), 0)?))
        .err()
        .map(|e| format!("{e:#}"))
        .expect("a policy with `pre` for `per` was accepted");
    assert!(refused.contains("pre"), "{refused}");
}

#[test]
fn the_compose_file_and_the_workflow_are_valid_and_name_only_files_that_exist() {
    let out = check_envoy(&["compose-and-workflows"]);
    for compose in [
        "docker-compose.yml",
        "docker-compose.ratelimit.yml",
        "docker-compose.rlqs.yml",
    ] {
        assert!(
            out.contains(&format!("envoy/{compose}: valid YAML")),
            "{out}"
        );
    }
    assert!(
        out.contains(".github/workflows/envoy.yml: valid YAML"),
        "{out}"
    );
}

#[test]
fn every_descriptor_the_native_rate_limit_config_sends_has_a_limit_in_envoy_ratelimit() {
    let out = check_envoy(&["rate-limit-descriptors"]);
    let config = sluice_server::rls::config::load(&[repo_root().join("envoy/ratelimit")])
        .unwrap_or_else(|e| panic!("envoy/ratelimit does not load: {e}"));
    let mut checked = 0;
    for line in out.lines() {
        let entry: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let domain = entry["domain"].as_str().expect("domain");
        for descriptor in entry["descriptors"].as_array().expect("descriptors") {
            let entries: Vec<(&str, &str)> = descriptor
                .as_array()
                .expect("entries")
                .iter()
                .map(|e| (e[0].as_str().expect("key"), e[1].as_str().expect("value")))
                .collect();
            assert!(
                config.lookup(domain, &entries).is_some(),
                "{}: the descriptor {entries:?} of domain {domain} has no limit in envoy/ratelimit/",
                entry["source"]
            );
            checked += 1;
        }
    }
    assert!(checked >= 2, "no descriptors found: {out}");
}
