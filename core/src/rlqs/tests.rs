use super::*;

fn config(json: &str) -> Result<RlqsConfig, FileError> {
    RlqsConfig::from_raw([serde_json::from_str::<RawRlqsConfig>(json).unwrap()])
}

fn bucket(entries: &[(&str, &str)]) -> BucketId {
    entries.iter().copied().collect()
}

const LIMIT: &str = r#"{"algorithm": "gcra", "rate": 10, "per": "1s", "burst": 10}"#;

#[test]
fn the_first_rule_a_bucket_id_meets_gives_its_quota_and_the_default_the_rest() {
    let config = config(&format!(
        r#"{{"domain": "d", "buckets": [
            {{"match": {{"name": "per-key", "key": "vip-*"}}, "allow": "all"}},
            {{"match": {{"name": "per-key", "key": "*"}}, "limit": {LIMIT}, "share": "equal"}},
            {{"match": {{"name": "blocked"}}, "deny": "all", "name": "blocked"}}
        ]}}"#
    ))
    .unwrap();
    let rule = |entries: &[(&str, &str)]| config.rule_for("d", &bucket(entries)).unwrap();
    assert_eq!(
        rule(&[("name", "per-key"), ("key", "vip-1")]).quota,
        Quota::AllowAll
    );
    let limited = rule(&[("name", "per-key"), ("key", "k1")]);
    assert!(matches!(limited.quota, Quota::Limit(_)));
    assert_eq!(
        (limited.name.as_str(), limited.share),
        ("bucket1", Share::Equal)
    );
    // Keys a rule does not name may be present; a key it names must be.
    assert_eq!(
        rule(&[("name", "blocked"), ("path", "/x")]).quota,
        Quota::DenyAll
    );
    let unmatched = rule(&[("name", "per-key")]);
    assert_eq!(
        (unmatched.name.as_str(), unmatched.quota),
        ("default", Quota::AllowAll)
    );
    assert!(
        config
            .rule_for("other", &bucket(&[("name", "x")]))
            .is_none()
    );
}

#[test]
fn each_bucket_id_is_a_limit_of_its_own_whatever_the_order_of_its_entries() {
    let one = bucket(&[("name", "per-key"), ("key", "k1")]);
    let two = bucket(&[("key", "k1"), ("name", "per-key")]);
    assert_eq!(bucket_key("d", &one), bucket_key("d", &two));
    assert_ne!(
        bucket_key("d", &one),
        bucket_key("d", &bucket(&[("name", "per-key"), ("key", "k2")]))
    );
    assert_ne!(bucket_key("d", &one), bucket_key("e", &one));
    // Joined naively, `a.b`=`c` and `a`=`b.c` would be one key.
    assert_ne!(
        bucket_key("d", &bucket(&[("a:b", "c")])),
        bucket_key("d", &bucket(&[("a", "b:c")]))
    );
}

#[test]
fn every_error_names_the_file_the_path_and_the_reason() {
    let refused = |json: &str| config(json).unwrap_err().to_string();
    assert_eq!(
        refused(r#"{"buckets": []}"#),
        "domain: a domain is required"
    );
    assert!(
        refused(r#"{"domain": "d", "buckets": [{"allow": "all"}]}"#)
            .starts_with("buckets[0].match: a rule needs at least one entry")
    );
    assert!(
        refused(r#"{"domain": "d", "buckets": [{"match": {"k": ""}, "allow": "all"}]}"#)
            .starts_with("buckets[0].match: `k`: keys and values must not be empty")
    );
    assert_eq!(
        refused(r#"{"domain": "d", "buckets": [{"match": {"k": "v"}}]}"#),
        "buckets[0]: give exactly one of `limit`, `allow: all` and `deny: all`"
    );
    assert_eq!(
        refused(
            r#"{"domain": "d", "buckets": [{"match": {"k": "v"}, "allow": "all", "deny": "all"}]}"#
        ),
        "buckets[0]: give exactly one of `limit`, `allow: all` and `deny: all`"
    );
    assert_eq!(
        refused(r#"{"domain": "d", "buckets": [{"match": {"k": "v"}, "allow": "some"}]}"#),
        "buckets[0].allow: must be `all`, not `some`"
    );
    assert!(
        refused(r#"{"domain": "d", "buckets": [{"match": {"k": "v"}, "limit": {"algorithm": "gcra", "rate": 1, "per": "1s"}}]}"#)
            .starts_with("buckets[0].limit: algorithm `gcra` needs `burst`")
    );
    assert_eq!(
        refused(
            r#"{"domain": "d", "buckets": [{"match": {"k": "v"}, "limit": {"algorithm": "gcra", "rate": 200, "per": "1s", "burst": 100}}]}"#
        ),
        "buckets[0].limit: admits 100 at once, less than one second of its rate (200): Envoy refills its token buckets once a second, and sluice funds each second's refill at once; raise `burst` (or `limit`) to 200"
    );
    assert!(
        refused(
            r#"{"domain": "d", "buckets": [{"match": {"k": "v"}, "limit": {"algorithm": "leaky_bucket", "rate": 5, "per": "1s", "burst": 5, "mode": "shaping", "max_wait": "1s"}}]}"#
        )
        .starts_with("buckets[0].limit: a shaping leaky bucket delays requests")
    );
    // A window admits its whole limit at once: 100 a minute is kept.
    config(r#"{"domain": "d", "buckets": [{"match": {"k": "v"}, "limit": {"algorithm": "sliding_window", "limit": 100, "window": "1m"}}]}"#).unwrap();
    assert_eq!(
        refused(
            r#"{"domain": "d", "buckets": [{"match": {"k": "v"}, "allow": "all", "share": "fair"}]}"#
        ),
        "buckets[0].share: must be `demand` or `equal`, not `fair`"
    );
    assert!(
        refused(r#"{"domain": "d", "buckets": [{"match": {"k": "v"}, "allow": "all", "name": "a"}, {"match": {"k": "w"}, "allow": "all", "name": "a"}]}"#)
            .starts_with("buckets[1].name: `a` names an earlier rule too")
    );
    assert_eq!(
        refused(r#"{"domain": "d", "default": {"deny": "all", "allow": "all"}}"#),
        "default: give exactly one of `limit`, `allow: all` and `deny: all`"
    );
    assert!(
        refused(r#"{"domain": "d", "idle_after": "500ms"}"#)
            .starts_with("idle_after: must be at least 1s")
    );
    let twice = RlqsConfig::from_raw(
        [r#"{"domain": "d"}"#, r#"{"domain": "d"}"#].map(|j| serde_json::from_str(j).unwrap()),
    )
    .unwrap_err();
    assert_eq!((twice.file, twice.path.as_str()), (1, "domain"));
}

#[test]
fn a_domain_without_rules_allows_all_and_abandons_buckets_idle_five_minutes() {
    let config = config(r#"{"domain": "d"}"#).unwrap();
    let (_, domain) = config.domains().next().unwrap();
    assert_eq!(domain.default.quota, Quota::AllowAll);
    assert_eq!(domain.idle_after.as_millis(), DEFAULT_IDLE_AFTER_MS);
}

#[test]
fn the_default_is_a_rule_without_match_and_may_name_itself_and_its_share() {
    let config = config(&format!(
        r#"{{"domain": "d", "default": {{"limit": {LIMIT}, "share": "equal", "name": "rest"}}}}"#
    ))
    .unwrap();
    let rule = config.rule_for("d", &bucket(&[("k", "v")])).unwrap();
    assert_eq!((rule.name.as_str(), rule.share), ("rest", Share::Equal));
    assert!(matches!(rule.quota, Quota::Limit(_)));
    assert!(
        config_error(r#"{"domain": "d", "default": {"match": {"k": "v"}, "allow": "all"}}"#)
            .starts_with("default.match: the default takes every bucket no rule matches")
    );
    assert_eq!(
        config_error(
            r#"{"domain": "d", "buckets": [{"match": {"k": "v"}, "allow": "all", "name": "default"}]}"#
        ),
        "default.name: `default` names a rule too"
    );
}

fn config_error(json: &str) -> String {
    config(json).unwrap_err().to_string()
}
