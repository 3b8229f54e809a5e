use super::raw::RawRlsConfig;
use super::*;
use crate::file_error::FileError;

fn config(json: serde_json::Value) -> Result<RlsConfig, FileError> {
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

mod requests {
    use super::super::answer::{Code, HitCounts, RlsHeaders};
    use super::super::request::{Applied, LimitOverride, RlsDescriptor, RlsRequest};
    use super::*;
    use crate::verdict::Verdict;

    fn descriptor(entries: &[(&str, &str)]) -> RlsDescriptor {
        RlsDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..RlsDescriptor::default()
        }
    }

    fn request(domain: &str, descriptors: Vec<RlsDescriptor>) -> RlsRequest {
        RlsRequest {
            domain: domain.to_owned(),
            descriptors,
            hits_addend: 0,
        }
    }

    fn verdict(allowed: bool, limit: u64, remaining: u64) -> Verdict {
        Verdict {
            allowed,
            limit,
            remaining,
            reset_ms: 30_500,
            retry_after_ms: (!allowed).then_some(30_500),
            delay_ms: 0,
        }
    }

    fn kind(applied: &Applied) -> &'static str {
        match applied {
            Applied::NoLimit => "none",
            Applied::Unlimited => "unlimited",
            Applied::Replaced => "replaced",
            Applied::Limited(_) => "limited",
        }
    }

    #[test]
    fn a_named_limit_is_replaced_and_unlimited_or_unmatched_descriptors_have_no_check() {
        // The reference's "replaces" example: a per-path limit replaces the generic one.
        let config = config(serde_json::json!({
            "domain": "example",
            "descriptors": [
                {"key": "api", "rate_limit": {"unit": "minute", "requests_per_unit": 10, "name": "api"}},
                {"key": "path", "value": "/special", "rate_limit": {"unit": "minute", "requests_per_unit": 50,
                    "replaces": [{"name": "api"}]}},
                {"key": "internal", "rate_limit": {"unlimited": true}},
            ]
        }))
        .unwrap();
        let plan = config
            .plan(&request(
                "example",
                vec![
                    descriptor(&[("api", "v1")]),
                    descriptor(&[("path", "/special")]),
                    descriptor(&[("internal", "yes")]),
                    descriptor(&[("other", "x")]),
                ],
            ))
            .unwrap();
        let kinds: Vec<_> = plan.descriptors.iter().map(kind).collect();
        assert_eq!(kinds, ["replaced", "limited", "unlimited", "none"]);
        let answer = plan.answer(&[verdict(true, 50, 49)], RlsHeaders::None);
        assert_eq!(answer.overall_code, Code::Ok);
        assert_eq!(answer.statuses[0].current_limit, None);
        assert_eq!(answer.statuses[1].limit_remaining, 49);
        assert_eq!(answer.statuses[2].limit_remaining, u32::MAX);
        assert_eq!(answer.statuses[3].limit_remaining, 0);
    }

    #[test]
    fn descriptors_that_name_alike_in_the_references_style_keep_their_own_counters() {
        // Each pair is one path the reference-style name (`key_value` joined by `.`) cannot
        // tell apart; every descriptor has a limit of its own.
        let config = config(serde_json::json!({
            "domain": "d", "descriptors": [
                {"key": "a.c", "rate_limit": rate("minute", 5)},
                {"key": "a", "rate_limit": rate("minute", 7),
                 "descriptors": [{"key": "c", "rate_limit": rate("minute", 1000)},
                                 {"key": "b.c", "rate_limit": rate("minute", 9)}]},
                {"key": "a_b", "rate_limit": rate("minute", 11),
                 "descriptors": [{"key": "c", "rate_limit": rate("minute", 13)}]},
            ]
        }))
        .unwrap();
        let colliding: [&[(&str, &str)]; 6] = [
            &[("a.c", "y")],
            &[("a", ""), ("c", "y")],
            &[("a", "b"), ("c", "y")],
            &[("a_b", ""), ("c", "y")],
            &[("a", ""), ("b.c", "y")],
            &[("a", "b.c_y")],
        ];
        let plan = config
            .plan(&request(
                "d",
                colliding
                    .iter()
                    .map(|entries| descriptor(entries))
                    .collect(),
            ))
            .unwrap();
        let mut keys: Vec<(String, String)> = plan
            .planned()
            .map(|(_, p)| (p.check.key.as_str().to_owned(), p.counter_id().to_owned()))
            .collect();
        assert_eq!(keys.len(), colliding.len(), "each is limited");
        keys.sort();
        keys.dedup();
        assert_eq!(
            keys.len(),
            colliding.len(),
            "six counters, not fewer: {keys:?}"
        );
    }

    #[test]
    fn hits_addend_of_a_descriptor_wins_over_the_requests_which_wins_over_one() {
        let config = config(serde_json::json!({
            "domain": "d", "descriptors": [{"key": "k", "rate_limit": rate("second", 10)}]
        }))
        .unwrap();
        let mut request = request(
            "d",
            vec![descriptor(&[("k", "a")]), descriptor(&[("k", "b")])],
        );
        let costs = |request: &RlsRequest| -> Vec<u64> {
            config
                .plan(request)
                .unwrap()
                .planned()
                .map(|(_, p)| p.check.cost)
                .collect()
        };
        assert_eq!(costs(&request), [1, 1]);
        request.hits_addend = 3;
        assert_eq!(costs(&request), [3, 3]);
        request.descriptors[1].hits_addend = Some(0);
        assert_eq!(costs(&request), [3, 0], "0 only asks");
    }

    #[test]
    fn a_descriptor_s_own_limit_is_a_fixed_window_named_by_its_entries_in_a_known_domain() {
        let config = config(serde_json::json!({"domain": "d", "descriptors": []})).unwrap();
        let mut own = descriptor(&[("user", "alice"), ("path", "")]);
        own.limit = Some(LimitOverride {
            requests_per_unit: 7,
            unit: Unit::Hour.proto(),
        });
        let plan = config.plan(&request("d", vec![own.clone()])).unwrap();
        let (_, planned) = plan.planned().next().unwrap();
        assert_eq!(planned.rule.full_key, "d.user_alice.path");
        assert_eq!(planned.check.limit.capacity(), 7);
        assert_eq!(planned.check.limit.nominal_rate().1.as_millis(), 3_600_000);
        let unknown = config
            .plan(&request("elsewhere", vec![own.clone()]))
            .unwrap();
        assert_eq!(kind(&unknown.descriptors[0]), "none");
        own.limit = Some(LimitOverride {
            requests_per_unit: 7,
            unit: 6,
        });
        let err = config.plan(&request("d", vec![own])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "descriptors[0].limit.unit: unit 6 is not one of SECOND, MINUTE, HOUR, DAY, WEEK or MONTH"
        );
    }

    #[test]
    fn a_request_without_domain_or_descriptors_or_with_negative_hits_is_refused_by_path() {
        let config = RlsConfig::default();
        let err = |r: &RlsRequest| config.plan(r).unwrap_err().to_string();
        assert_eq!(
            err(&request("", vec![descriptor(&[("k", "v")])])),
            "domain: rate limit domain must not be empty"
        );
        assert_eq!(
            err(&request("d", vec![])),
            "descriptors: rate limit descriptor list must not be empty"
        );
        let mut negative = descriptor(&[("k", "v")]);
        negative.is_negative_hits = true;
        assert_eq!(
            err(&request("d", vec![descriptor(&[("k", "v")]), negative])),
            "descriptors[1].is_negative_hits: refunding hits is not supported"
        );
    }

    #[test]
    fn shadow_mode_answers_ok_and_the_headers_name_the_descriptor_over_or_closest_to_its_limit() {
        let config = config(serde_json::json!({
            "domain": "d",
            "descriptors": [
                {"key": "a", "rate_limit": rate("minute", 10)},
                {"key": "b", "shadow_mode": true, "rate_limit": rate("minute", 5)},
                {"key": "c", "rate_limit": rate("minute", 20)},
            ]
        }))
        .unwrap();
        let plan = config
            .plan(&request(
                "d",
                vec![
                    descriptor(&[("a", "1")]),
                    descriptor(&[("b", "1")]),
                    descriptor(&[("c", "1")]),
                ],
            ))
            .unwrap();
        let verdicts = [
            verdict(true, 10, 4),
            verdict(false, 5, 0),
            verdict(true, 20, 2),
        ];
        let answer = plan.answer(&verdicts, RlsHeaders::Reference);
        assert_eq!(
            answer.overall_code,
            Code::Ok,
            "only the shadow limit is over"
        );
        let codes: Vec<_> = answer.statuses.iter().map(|s| s.code).collect();
        assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok]);
        assert_eq!(answer.statuses[1].limit_remaining, 0);
        let header = |answer: &super::super::answer::Answer, name: &str| {
            answer
                .headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        // As the reference does, the shadow limit over its limit reports 0 left, the least.
        assert_eq!(header(&answer, "RateLimit-Limit").as_deref(), Some("5"));
        assert_eq!(header(&answer, "RateLimit-Remaining").as_deref(), Some("0"));
        assert_eq!(header(&answer, "RateLimit-Reset").as_deref(), Some("31"));

        let denied = [
            verdict(false, 10, 0),
            verdict(true, 5, 3),
            verdict(true, 20, 2),
        ];
        let answer = plan.answer(&denied, RlsHeaders::Ietf);
        assert_eq!(answer.overall_code, Code::OverLimit);
        assert_eq!(answer.statuses[0].code, Code::OverLimit);
        assert_eq!(
            header(&answer, "ratelimit-policy").as_deref(),
            Some("\"d.a\";q=10;w=60")
        );
        assert_eq!(
            header(&answer, "ratelimit").as_deref(),
            Some("\"d.a\";r=0;t=31")
        );
    }

    #[test]
    fn hits_are_counted_as_the_reference_counts_them() {
        let config = config(serde_json::json!({
            "domain": "d", "descriptors": [{"key": "k", "shadow_mode": true, "rate_limit": rate("second", 10)}]
        }))
        .unwrap();
        let mut request = request("d", vec![descriptor(&[("k", "v")])]);
        request.hits_addend = 4;
        let plan = config.plan(&request).unwrap();
        let (_, planned) = plan.planned().next().unwrap();
        // 5 used before, 4 taken: 9 of 10, past the near-limit threshold of 8 by one.
        let allowed = HitCounts::of(planned, &verdict(true, 10, 1), true, false);
        assert_eq!(
            (
                allowed.total_hits,
                allowed.within_limit,
                allowed.near_limit,
                allowed.over_limit
            ),
            (4, 4, 1, 0)
        );
        // 7 used, 4 asked: 11, one over the limit, two near it (8 to 10), none taken.
        let denied = HitCounts::of(planned, &verdict(false, 10, 3), false, false);
        assert_eq!(
            (
                denied.over_limit,
                denied.near_limit,
                denied.within_limit,
                denied.shadow_mode
            ),
            (1, 2, 0, 1)
        );
        let cached = HitCounts::of(planned, &verdict(false, 10, 0), false, true);
        assert_eq!(
            (
                cached.over_limit,
                cached.over_limit_with_local_cache,
                cached.shadow_mode
            ),
            (4, 4, 4)
        );
    }
}

#[test]
fn a_limit_of_zero_blocks_every_request_but_one_that_only_asks() {
    // The reference's example 3: an address on a block list.
    use crate::algorithm::Request;
    let config = config(serde_json::json!({
        "domain": "edge_proxy_per_ip",
        "descriptors": [{"key": "remote_address", "value": "50.0.0.5", "rate_limit": rate("second", 0)}]
    }))
    .unwrap();
    let found = config
        .lookup("edge_proxy_per_ip", &[("remote_address", "50.0.0.5")])
        .unwrap();
    let limit = found.rule.limit.unwrap();
    let at = |cost| Request {
        now_us: 1_700_000_000_000_000,
        cost,
        count_denied: false,
    };
    let denied = limit.decide(None, at(1)).verdict;
    assert!(
        !denied.allowed && denied.retry_after_ms.is_none(),
        "no wait admits it: {denied:?}"
    );
    assert!(limit.decide(None, at(0)).verdict.allowed);
}

#[test]
fn a_star_anywhere_in_a_value_matches_any_run_of_characters() {
    // The reference's example 9.
    let config = config(serde_json::json!({
        "domain": "example9",
        "descriptors": [
            {"key": "path", "value": "/api/*/action", "rate_limit": rate("minute", 20)},
            {"key": "route", "value": "/api/*/resource/*/action", "rate_limit": rate("minute", 30)},
        ]
    }))
    .unwrap();
    let limit_of = |key, value| {
        config
            .lookup("example9", &[(key, value)])
            .map(|f| f.rule.requests_per_unit)
    };
    assert_eq!(limit_of("path", "/api/123/action"), Some(20));
    assert_eq!(limit_of("path", "/api//action"), Some(20));
    assert_eq!(limit_of("path", "/api/123/other"), None);
    assert_eq!(limit_of("route", "/api/v1/resource/123/action"), Some(30));
    assert_eq!(limit_of("route", "/api/v1/resource/action"), None);
    assert!(super::wildcard_match("k_a*a", "k_aa"));
    assert!(
        !super::wildcard_match("k_a*a", "k_a"),
        "the parts may not overlap"
    );
}
