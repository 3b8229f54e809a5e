use super::*;

const LIMIT: &str = r#"{"algorithm":"fixed_window","limit":10,"window":"1s"}"#;

fn policy(rules: &str) -> Result<Policy, String> {
    Policy::from_json(format!(r#"{{"cluster":"sluice","rules":[{rules}]}}"#).as_bytes())
        .map_err(|e| e.to_string())
}

fn rule(name: &str, extra: &str) -> String {
    format!(r#"{{"name":"{name}","key":["client_ip"],"limit":{LIMIT}{extra}}}"#)
}

fn request(pairs: &[(&str, &str)]) -> HttpRequest<'static> {
    HttpRequest {
        headers: pairs
            .iter()
            .map(|(n, v)| (n.to_string().into(), v.as_bytes().to_vec().into()))
            .collect(),
        source_address: Some("192.0.2.10:40000".into()),
    }
}

#[test]
fn defaults_are_documented_ones() {
    let p = policy(&rule("r", "")).unwrap();
    assert_eq!(p.service.authority, "sluice");
    assert_eq!(p.service.timeout.as_millis(), 100);
    assert_eq!(p.failure_mode, FailureMode::Allow);
    assert_eq!(p.deny_cache_slots, 4096);
    assert_eq!(p.response.status, 429);
    assert_eq!(p.response.headers, HeaderStyle::XRateLimit);
    assert_eq!(p.rules[0].cost, 1);
}

#[test]
fn configuration_errors_name_the_field() {
    let cases: Vec<(String, &str)> = vec![
        (
            rule("r", r#","shadow":"yes""#),
            "rules[0].shadow: invalid type: string \"yes\", expected a boolean",
        ),
        (
            rule("r", r#","colour":1"#),
            "rules[0].colour: unknown field `colour`",
        ),
        (rule("a b", ""), "rules[0].name: `a b` is not a rule name"),
        (
            format!("{},{}", rule("r", ""), rule("r", "")),
            "rules[1].name: `r` is the name of an earlier rule",
        ),
        (
            rule("r", r#","match":{"path":{"prefix":"/a","exact":"/b"}}"#),
            "rules[0].match.path: give only one of",
        ),
        (
            rule("r", r#","match":{"path":{"regex":"("}}"#),
            "rules[0].match.path.regex: invalid regex",
        ),
        (
            rule("r", r#","match":{"method":"get"}"#),
            "rules[0].match.method: `get` is not a method",
        ),
        (
            rule("r", r#","match":{"headers":[{"name":"x"}]}"#),
            "rules[0].match.headers[0]: give `present`",
        ),
        (
            rule(
                "r",
                r#","match":{"headers":[{"name":"x","present":true,"exact":"v"}]}"#,
            ),
            "rules[0].match.headers[0]: `present` cannot be combined",
        ),
        (
            r#"{"name":"r","key":[],"limit":LIMIT}"#.replace("LIMIT", LIMIT),
            "rules[0].key: needs at least one part",
        ),
        (
            r#"{"name":"r","key":["ip"],"limit":LIMIT}"#.replace("LIMIT", LIMIT),
            "rules[0].key[0]: unknown key part `ip`",
        ),
        (
            r#"{"name":"r","key":[{"header":"x","query":"y"}],"limit":LIMIT}"#
                .replace("LIMIT", LIMIT),
            "rules[0].key[0]: give exactly one of",
        ),
        (
            rule("r", r#","cost":2000000000"#),
            "rules[0].cost: must be at most 1000000000",
        ),
    ];
    for (rules, expected) in cases {
        let err = policy(&rules).unwrap_err();
        assert!(
            err.starts_with(expected),
            "{rules}\n  got:  {err}\n  want: {expected}"
        );
    }
    let top = |json: &str| Policy::from_json(json.as_bytes()).unwrap_err().to_string();
    assert!(top(r#"{"rules":[]}"#).contains("missing field `cluster`"));
    assert_eq!(
        top(r#"{"cluster":"s","rules":[],"failure_mode":"maybe"}"#),
        "failure_mode: must be `allow` or `deny`, not `maybe`"
    );
    assert_eq!(
        top(r#"{"cluster":"s","rules":[],"timeout":"2m"}"#),
        "timeout: must be at most 60s, not 2m"
    );
    assert_eq!(
        top(r#"{"cluster":"s","rules":[],"response":{"status":200}}"#),
        "response.status: must be an error status (400 to 599), not 200"
    );
    assert_eq!(
        top(r#"{"cluster":"s","rules":[],"deny_cache":{"slots":0}}"#),
        "deny_cache.slots: must be between 1 and 1048576, not 0"
    );
    assert!(
        top(r#"{"cluster":"s","rules":[],"deny_cache":"yes"}"#)
            .starts_with("deny_cache: true, false, or")
    );
    let trailing = r#"{"cluster":"s","rules":[]} trailing"#;
    assert!(
        top(trailing).contains("trailing characters"),
        "{}",
        top(trailing)
    );
}

#[test]
fn rules_match_on_path_method_host_and_headers() {
    let p = policy(&rule(
        "r",
        r#","match":{"path":{"regex":"/users/[0-9]+"},"method":["GET","HEAD"],"host":{"suffix":".example.com"},"headers":[{"name":"X-Plan","exact":"free"},{"name":"x-internal","present":false}]}"#,
    ))
    .unwrap();
    let base = [
        (":path", "/users/42?x=1"),
        (":method", "GET"),
        (":authority", "API.Example.com:443"),
        ("x-plan", "free"),
    ];
    assert_eq!(p.checks_for(&request(&base)).len(), 1);
    let mut other_path = base;
    other_path[0] = (":path", "/users/42/edit");
    assert!(
        p.checks_for(&request(&other_path)).is_empty(),
        "regex matches the whole path"
    );
    let mut post = base;
    post[1] = (":method", "POST");
    assert!(p.checks_for(&request(&post)).is_empty());
    let mut internal = base.to_vec();
    internal.push(("x-internal", "1"));
    assert!(p.checks_for(&request(&internal)).is_empty());
}

#[test]
fn regexes_read_as_re2_reads_them() {
    let matching = |pattern: &str, value: &[u8]| {
        let p = policy(&rule(
            "r",
            &format!(r#","match":{{"headers":[{{"name":"x-v","regex":{pattern:?}}}]}}"#),
        ))
        .unwrap();
        let mut r = request(&[(":path", "/")]);
        r.headers.push(("x-v".into(), value.to_vec().into()));
        !p.checks_for(&r).is_empty()
    };
    // As in RE2, Perl classes are ASCII: an Arabic-Indic digit is no `\d`.
    assert!(matching(r"\d+", b"42"));
    assert!(!matching(r"\d+", "\u{664}".as_bytes()));
    // A value that is not UTF-8 still matches where its bad byte stands for one character.
    assert!(matching("a.b", b"a\xffb"));
    assert!(!matching("ab", b"a\xffb"));
    // Unicode classes are refused when the policy loads, saying where.
    let refused = policy(&rule("r", r#","match":{"path":{"regex":"\\p{Greek}"}}"#)).unwrap_err();
    assert!(
        refused.starts_with("rules[0].match.path.regex: invalid regex"),
        "{refused}"
    );
}

#[test]
fn keys_are_built_from_parts_and_missing_parts_skip_the_rule() {
    let p = policy(
        &format!(
            r#"{{"name":"tenant","key":[{{"header":"X-Tenant"}},"method",{{"query":"v","default":"1"}},{{"const":"c"}}],"limit":{LIMIT}}}"#
        ),
    )
    .unwrap();
    let with = request(&[
        (":path", "/x?v=2"),
        (":method", "PUT"),
        ("x-tenant", "acme"),
    ]);
    assert_eq!(p.checks_for(&with)[0].key.as_str(), "acme:PUT:2:c");
    let defaulted = request(&[(":path", "/x"), (":method", "PUT"), ("x-tenant", "acme")]);
    assert_eq!(p.checks_for(&defaulted)[0].key.as_str(), "acme:PUT:1:c");
    let without = request(&[(":path", "/x"), (":method", "PUT")]);
    assert!(p.checks_for(&without).is_empty());
}

#[test]
fn every_matching_rule_becomes_a_check_in_rule_order() {
    let p = policy(&format!(
        "{},{},{}",
        rule("per-ip", ""),
        rule("api-only", r#","match":{"path":{"prefix":"/api"}}"#),
        rule("shadowed", r#","shadow":true,"cost":3"#)
    ))
    .unwrap();
    let checks = p.checks_for(&request(&[(":path", "/static/a.css"), (":method", "GET")]));
    let names: Vec<&str> = checks
        .iter()
        .map(|c| p.rules[c.rule].name.as_str())
        .collect();
    assert_eq!(names, ["per-ip", "shadowed"]);
    let shadowed = p.rules[checks[1].rule].check(checks[1].key.clone());
    assert!(shadowed.shadow);
    assert_eq!(shadowed.cost, 3);
    assert_eq!(checks[1].rule, 2);
}

#[test]
fn the_policy_knows_which_headers_its_rules_read() {
    let p = policy(&format!(
        "{},{}",
        rule("per-ip", r#","match":{"headers":[{"name":"X-Internal","present":false}]}"#),
        r#"{"name":"t","match":{"method":"GET","host":{"exact":"a"}},"key":[{"header":"X-Tenant"},{"query":"v","default":"1"}],"limit":LIMIT}"#.replace("LIMIT", LIMIT)
    ))
    .unwrap();
    assert_eq!(
        p.headers_read.as_deref().unwrap(),
        [
            ":authority",
            ":method",
            ":path",
            "host",
            "x-internal",
            "x-tenant"
        ]
    );
    let behind_proxies = Policy::from_json(
        format!(
            r#"{{"cluster":"c","trusted_hops":1,"rules":[{}]}}"#,
            rule("per-ip", "")
        )
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(
        behind_proxies.headers_read, None,
        "every x-forwarded-for line"
    );
}

#[test]
fn a_lease_derives_its_units_from_the_capacity() {
    let lease = |extra: &str| {
        let json = format!(
            r#"{{"name":"r","key":["client_ip"],"limit":{{"algorithm":"gcra","rate":1000,"per":"1s","burst":2000}}{extra}}}"#
        );
        policy(&json)
    };
    let p = lease(r#","lease":{"horizon":"200ms"}"#).unwrap();
    let config = p.rules[0].lease.unwrap();
    assert_eq!(config.horizon.as_millis(), 200);
    assert_eq!(
        (config.terms.max_units, config.terms.max_outstanding),
        (200, 1000)
    );
    assert_eq!(
        config.terms.ttl.as_millis(),
        1000,
        "five horizons, at least 1s"
    );
    assert_eq!(config.tick_ms(), 50);
    let p = lease(r#","lease":{"horizon":"1s","max_share":0.25,"max_total_share":1,"ttl":"4s"}"#)
        .unwrap();
    let config = p.rules[0].lease.unwrap();
    assert_eq!(
        (config.terms.max_units, config.terms.max_outstanding),
        (500, 2000)
    );
    assert_eq!(config.terms.ttl.as_millis(), 4000);
    assert!(policy(&rule("r", "")).unwrap().rules[0].lease.is_none());
}

#[test]
fn lease_settings_that_cannot_work_are_refused_by_name() {
    let cases = [
        (rule("r", r#","lease":{}"#), "rules[0].lease: missing field `horizon`"),
        (rule("r", r#","lease":{"horizon":"2m","max_share":0.5}"#), "rules[0].lease.horizon: must be at most 1m"),
        (rule("r", r#","lease":{"horizon":"1s","max_share":0}"#), "rules[0].lease.max_share: must be a share"),
        (rule("r", r#","lease":{"horizon":"1s","max_share":1.5}"#), "rules[0].lease.max_share: must be a share"),
        (
            rule("r", r#","lease":{"horizon":"1s","max_share":0.5,"max_total_share":0.2}"#),
            "rules[0].lease.max_total_share: must be at least `max_share` (0.5)",
        ),
        (rule("r", r#","lease":{"horizon":"1s","max_share":0.5,"ttl":"1s"}"#), "rules[0].lease.ttl: must be between two horizons (2000ms)"),
        (
            rule("r", r#","count_denied":true,"lease":{"horizon":"1s"}"#),
            "rules[0].lease: cannot go with `count_denied`",
        ),
        (
            rule("r", r#","lease":{"horizon":"1s"}"#),
            "rules[0].lease.max_share: lets one Envoy hold 1 units of 10, not two requests' worth (2): such a lease saves no callout; raise it to at least 0.2",
        ),
        (
            rule("r", r#","cost":3,"lease":{"horizon":"1s","max_share":0.5}"#),
            "rules[0].lease.max_share: lets one Envoy hold 5 units of 10, not two requests' worth (6)",
        ),
        (
            r#"{"name":"r","key":["client_ip"],"limit":{"algorithm":"leaky_bucket","rate":1,"per":"1s","burst":10,"mode":"shaping","max_wait":"1s"},"lease":{"horizon":"1s"}}"#.to_owned(),
            "rules[0].lease: a shaping leaky bucket cannot be leased",
        ),
    ];
    for (json, expected) in cases {
        let err = policy(&json).unwrap_err();
        assert!(
            err.starts_with(expected),
            "{json}\n  got:  {err}\n  want: {expected}"
        );
    }
}
