use super::raw::RawRlsConfig;
use super::*;

fn config(json: serde_json::Value) -> Result<RlsConfig, RlsConfigError> {
    let raw: RawRlsConfig = serde_json::from_value(json).unwrap();
    RlsConfig::from_raw([raw])
}

fn rate(unit: &str, n: u64) -> serde_json::Value {
    serde_json::json!({"unit": unit, "requests_per_unit": n})
}

#[test]
fn an_exact_value_wins_over_the_bare_key_and_a_bare_key_counts_each_value_apart() {
    // The reference's "edge_proxy_per_ip" example.
    let config = config(serde_json::json!({
        "domain": "edge_proxy_per_ip",
        "descriptors": [
            {"key": "remote_address", "rate_limit": rate("second", 10)},
            {"key": "remote_address", "value": "50.0.0.5", "rate_limit": rate("second", 5)},
        ]
    }))
    .unwrap();
    let special = config
        .lookup("edge_proxy_per_ip", &[("remote_address", "50.0.0.5")])
        .unwrap();
    assert_eq!(special.rule.requests_per_unit, 5);
    assert_eq!(
        special.rule.full_key,
        "edge_proxy_per_ip.remote_address_50.0.0.5"
    );
    let a = config
        .lookup("edge_proxy_per_ip", &[("remote_address", "10.0.0.1")])
        .unwrap();
    let b = config
        .lookup("edge_proxy_per_ip", &[("remote_address", "10.0.0.2")])
        .unwrap();
    assert_eq!(a.rule.requests_per_unit, 10);
    assert_eq!(a.rule, b.rule);
    assert_ne!(a.counter, b.counter, "each address has its own counter");
    assert!(
        config
            .lookup("other_domain", &[("remote_address", "10.0.0.1")])
            .is_none()
    );
}

#[test]
fn nested_descriptors_apply_only_where_the_request_descriptor_ends() {
    // The reference's "messaging" example.
    let config = config(serde_json::json!({
        "domain": "messaging",
        "descriptors": [
            {"key": "message_type", "value": "marketing",
             "descriptors": [{"key": "to_number", "rate_limit": rate("day", 5)}]},
            {"key": "to_number", "rate_limit": rate("day", 100)},
        ]
    }))
    .unwrap();
    let nested = config
        .lookup(
            "messaging",
            &[("message_type", "marketing"), ("to_number", "2061234567")],
        )
        .unwrap();
    assert_eq!(
        (nested.rule.unit, nested.rule.requests_per_unit),
        (Unit::Day, 5)
    );
    assert_eq!(
        nested.counter,
        "message_type_marketing.to_number_2061234567"
    );
    assert!(
        config
            .lookup("messaging", &[("message_type", "marketing")])
            .is_none(),
        "the first level has no limit of its own"
    );
    assert!(
        config
            .lookup(
                "messaging",
                &[
                    ("message_type", "marketing"),
                    ("to_number", "1"),
                    ("x", "y")
                ]
            )
            .is_none(),
        "a descriptor longer than the tree"
    );
    let top = config
        .lookup("messaging", &[("to_number", "2061234567")])
        .unwrap();
    assert_eq!(top.rule.requests_per_unit, 100);
}

#[test]
fn a_value_ending_in_a_star_matches_by_prefix_after_exact_values() {
    let config = config(serde_json::json!({
        "domain": "api",
        "descriptors": [
            {"key": "path", "value": "/admin/*", "rate_limit": rate("minute", 1)},
            {"key": "path", "value": "/admin/ok", "rate_limit": rate("minute", 50)},
            {"key": "path", "rate_limit": rate("minute", 100)},
        ]
    }))
    .unwrap();
    let limit_of = |path| {
        config
            .lookup("api", &[("path", path)])
            .unwrap()
            .rule
            .requests_per_unit
    };
    assert_eq!(limit_of("/admin/users"), 1);
    assert_eq!(limit_of("/admin/ok"), 50);
    assert_eq!(limit_of("/shop"), 100);
}

#[test]
fn unlimited_shadow_mode_names_and_the_sluice_extension_are_kept() {
    let config = config(serde_json::json!({
        "domain": "d",
        "descriptors": [
            {"key": "tier", "value": "internal", "rate_limit": {"unlimited": true}},
            {"key": "tier", "value": "trial", "shadow_mode": true,
             "rate_limit": {"unit": "second", "requests_per_unit": 10, "name": "trial",
                            "replaces": [{"name": "default"}],
                            "sluice": {"algorithm": "gcra", "rate": 10, "per": "1s", "burst": 20}}},
            {"key": "user", "detailed_metric": true, "rate_limit": rate("hour", 3600)},
        ]
    }))
    .unwrap();
    let internal = config.lookup("d", &[("tier", "internal")]).unwrap();
    assert!(internal.rule.limit.is_none(), "unlimited");
    let trial = config.lookup("d", &[("tier", "trial")]).unwrap();
    assert!(trial.rule.shadow_mode);
    assert_eq!(trial.rule.replaces, ["default"]);
    let limit = trial.rule.limit.as_ref().unwrap();
    assert_eq!((limit.algorithm().name(), limit.capacity()), ("gcra", 20));
    let user = config.lookup("d", &[("user", "alice")]).unwrap();
    assert_eq!(
        user.stats_key, "d.user_alice",
        "detailed_metric names the value"
    );
    let fixed = user.rule.limit.as_ref().unwrap();
    assert_eq!(
        fixed.algorithm().name(),
        "fixed_window",
        "the reference's algorithm"
    );
    assert_eq!(fixed.nominal_rate().1.as_millis(), 3_600_000);
}

#[test]
fn every_error_names_its_path_and_reason() {
    let cases = [
        (
            serde_json::json!({"descriptors": []}),
            "domain: a configuration needs a domain",
        ),
        (
            serde_json::json!({"domain": "d", "descriptors": [{"value": "v"}]}),
            "descriptors[0].key: a descriptor needs a key",
        ),
        (
            serde_json::json!({"domain": "d", "descriptors": [{"key": "k"}, {"key": "k"}]}),
            "descriptors[1]: `d.k` is configured twice",
        ),
        (
            serde_json::json!({"domain": "d", "descriptors": [{"key": "k", "descriptors": [
                {"key": "n", "rate_limit": {"unit": "fortnight", "requests_per_unit": 1}}]}]}),
            "descriptors[0].descriptors[0].rate_limit.unit: unknown unit `fortnight` (second, minute, hour, day, week or month)",
        ),
        (
            serde_json::json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"requests_per_unit": 1}}]}),
            "descriptors[0].rate_limit.unit: a limit needs a unit",
        ),
        (
            serde_json::json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"unlimited": true, "unit": "second"}}]}),
            "descriptors[0].rate_limit: an unlimited limit takes no unit, requests_per_unit or sluice",
        ),
        (
            serde_json::json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {
                "unit": "second", "requests_per_unit": 1, "name": "a", "replaces": [{"name": "a"}]}}]}),
            "descriptors[0].rate_limit.replaces[0].name: a limit cannot replace itself",
        ),
        (
            serde_json::json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {
                "unit": "second", "requests_per_unit": 10,
                "sluice": {"algorithm": "token_bucket", "rate": 5, "per": "1s", "burst": 10}}}]}),
            "descriptors[0].rate_limit.sluice: its steady rate, 5 per 1s, is not requests_per_unit (10) per second, which answers report",
        ),
    ];
    for (json, expected) in cases {
        let err = config(json).unwrap_err();
        assert_eq!(err.to_string(), expected);
    }
    let same: RawRlsConfig = serde_json::from_value(serde_json::json!({"domain": "d"})).unwrap();
    let err = RlsConfig::from_raw([same.clone(), same]).unwrap_err();
    assert_eq!((err.file, err.path.as_str()), (1, "domain"));
}
