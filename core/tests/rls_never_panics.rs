//! What Envoy's rate limit filter sends over gRPC, arbitrary: any domain, descriptors of any
//! entries, limit overrides and hits of any size. The service plans it against a configuration
//! that uses every feature, and answers it from any verdicts Redis might give: it may refuse a
//! request, it never panics.

#![allow(clippy::unwrap_used)] // test code

use proptest::prelude::*;
use sluice_core::rls::raw::RawRlsConfig;
use sluice_core::rls::request::{LimitOverride, RlsDescriptor, RlsRequest};
use sluice_core::rls::{RlsConfig, answer::RlsHeaders};
use sluice_core::verdict::Verdict;

fn configuration() -> RlsConfig {
    let raw: RawRlsConfig = serde_json::from_value(serde_json::json!({
        "domain": "d",
        "descriptors": [
            {"key": "remote_address", "rate_limit": {"unit": "second", "requests_per_unit": 10}},
            {"key": "remote_address", "value": "50.0.0.5", "rate_limit": {"unit": "second", "requests_per_unit": 5}},
            {"key": "tier", "value": "internal", "rate_limit": {"unlimited": true}},
            {"key": "tier", "value": "trial", "shadow_mode": true,
             "rate_limit": {"unit": "second", "requests_per_unit": 10, "name": "trial",
                            "replaces": [{"name": "default"}],
                            "sluice": {"algorithm": "gcra", "rate": 10, "per": "1s", "burst": 20}}},
            {"key": "path", "value": "/api/*", "rate_limit": {"unit": "minute", "requests_per_unit": 0}},
            {"key": "user", "detailed_metric": true, "rate_limit": {"unit": "hour", "requests_per_unit": 3600, "name": "default"},
             "descriptors": [{"key": "path", "rate_limit": {"unit": "day", "requests_per_unit": 1_000_000_000}}]},
        ]
    }))
    .unwrap();
    RlsConfig::from_raw([raw]).unwrap()
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("d".to_owned()),
        Just("remote_address".to_owned()),
        Just("50.0.0.5".to_owned()),
        Just("tier".to_owned()),
        Just("internal".to_owned()),
        Just("trial".to_owned()),
        Just("path".to_owned()),
        Just("/api/x".to_owned()),
        Just("user".to_owned()),
        Just(String::new()),
        ".{0,12}",
    ]
}

fn entry_key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec!["remote_address", "tier", "user", "path"]).prop_map(str::to_owned),
        1 => text(),
    ]
}

fn descriptor() -> impl Strategy<Value = RlsDescriptor> {
    (
        prop::collection::vec((entry_key(), text()), 1..4),
        // Units Envoy knows (1 to 5, 7) and others.
        prop::option::weighted(
            0.1,
            (prop_oneof![0u32..100, any::<u32>()], -1i32..8).prop_map(
                |(requests_per_unit, unit)| LimitOverride {
                    requests_per_unit,
                    unit,
                },
            ),
        ),
        prop::option::weighted(0.3, prop_oneof![9 => 0u64..20, 1 => any::<u64>()]),
        prop::bool::weighted(0.03),
    )
        .prop_map(
            |(entries, limit, hits_addend, is_negative_hits)| RlsDescriptor {
                entries,
                limit,
                hits_addend,
                is_negative_hits,
            },
        )
}

fn verdict() -> impl Strategy<Value = Verdict> {
    (
        any::<bool>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        prop::option::of(any::<u64>()),
    )
        .prop_map(
            |(allowed, limit, remaining, reset_ms, retry_after_ms)| Verdict {
                allowed,
                limit,
                remaining,
                reset_ms,
                retry_after_ms,
                delay_ms: 0,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_request_is_planned_and_answered_without_panic(
        domain in prop_oneof![4 => Just("d".to_owned()), 1 => text()],
        descriptors in prop::collection::vec(descriptor(), 0..6),
        hits_addend in prop_oneof![9 => 0u32..20, 1 => any::<u32>()],
        verdicts in prop::collection::vec(verdict(), 0..8),
        headers in prop_oneof![Just(RlsHeaders::None), Just(RlsHeaders::Reference), Just(RlsHeaders::Ietf)],
    ) {
        let request = RlsRequest { domain, descriptors, hits_addend };
        if let Ok(plan) = configuration().plan(&request) {
            let planned = plan.planned().count();
            let mut verdicts = verdicts;
            verdicts.resize(planned, verdicts.first().copied().unwrap_or(Verdict {
                allowed: true, limit: 1, remaining: 0, reset_ms: 0, retry_after_ms: None, delay_ms: 0,
            }));
            let answer = plan.answer(&verdicts, headers);
            prop_assert_eq!(answer.statuses.len(), request.descriptors.len());
        }
    }
}
