use std::net::IpAddr;

use sluice_server::envoy_api::protobuf::{Duration as ProtoDuration, UInt32Value};
use sluice_server::envoy_api::quota::{
    Action, BucketAction, BucketId, QuotaAssignmentAction, RateLimitQuotaResponse,
    RateLimitStrategy, Strategy, TokenBucket,
};

use super::config::{Blanket, QuotaConfig};
use super::envoy::QuotaEnvoy;

const SHIPPED: &str = include_str!("../../../envoy/envoy-rlqs.yaml");

fn bucket_of(
    config: &QuotaConfig,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<Vec<(String, String)>> {
    let mut all: Vec<(String, String)> = vec![(":path".into(), path.into())];
    all.extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let peer: IpAddr = "192.0.2.7".parse().unwrap();
    let request = config.addresses.downstream(&all, peer);
    config.bucket(&request).map(|(_, mut id)| {
        id.sort();
        id
    })
}

fn pairs(entries: &[(&str, &str)]) -> Vec<(String, String)> {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn the_shipped_matchers_give_a_bucket_per_key_per_client_on_api_and_one_for_the_rest() {
    let config = QuotaConfig::parse(SHIPPED).unwrap();
    assert_eq!(config.domain, "edge");
    assert_eq!(
        bucket_of(&config, "/x", &[("x-api-key", "k1")]),
        Some(pairs(&[("key", "k1"), ("name", "per-key")]))
    );
    assert_eq!(
        bucket_of(&config, "/api/orders", &[]),
        Some(pairs(&[("client", "192.0.2.7"), ("name", "per-client")]))
    );
    assert_eq!(
        bucket_of(&config, "/", &[]),
        Some(pairs(&[("name", "catch-all")]))
    );
    let per_key = &config.settings[0];
    assert_eq!(per_key.denied_status, 429);
    assert_eq!(per_key.no_assignment, Blanket::AllowAll);
}

#[test]
fn an_input_a_trace_cannot_carry_is_refused_naming_it() {
    let changed = SHIPPED.replacen(
        "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
        "type.googleapis.com/envoy.type.matcher.v3.HttpResponseHeaderMatchInput",
        1,
    );
    let error = QuotaConfig::parse(&changed).unwrap_err().to_string();
    assert!(
        error.contains("HttpResponseHeaderMatchInput") && error.contains("bucket_matchers"),
        "{error}"
    );
}

fn assign(
    id: &[(String, String)],
    tokens: u32,
    every_s: i64,
    ttl_s: i64,
) -> RateLimitQuotaResponse {
    RateLimitQuotaResponse {
        bucket_action: vec![BucketAction {
            bucket_id: Some(BucketId {
                bucket: id.iter().cloned().collect(),
            }),
            bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(ProtoDuration {
                    seconds: ttl_s,
                    nanos: 0,
                }),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(Strategy::TokenBucket(TokenBucket {
                        max_tokens: tokens,
                        tokens_per_fill: Some(UInt32Value { value: tokens }),
                        fill_interval: Some(ProtoDuration {
                            seconds: every_s,
                            nanos: 0,
                        }),
                    })),
                }),
            })),
        }],
    }
}

#[test]
fn an_assignment_is_a_token_bucket_until_it_lapses_then_the_fallback_decides() {
    let config = QuotaConfig::parse(SHIPPED).unwrap();
    let settings = &config.settings[0];
    let id = pairs(&[("key", "k1"), ("name", "per-key")]);
    let mut envoy = QuotaEnvoy::default();
    let second = 1_000_000;
    // Before any assignment: ALLOW_ALL; the new bucket is reported at once.
    assert!(envoy.decide(&id, settings, 0));
    let report = envoy.new_buckets_report("edge", 0).unwrap();
    assert_eq!(report.bucket_quota_usages[0].num_requests_allowed, 1);
    // 2 tokens a second, holding 2, for 10 s.
    envoy.apply(&[assign(&id, 2, 1, 10)], 0);
    let admitted_in_second = |envoy: &mut QuotaEnvoy, start: i64| {
        (0..10)
            .filter(|i| envoy.decide(&id, settings, start + i * second / 10))
            .count()
    };
    assert_eq!(
        admitted_in_second(&mut envoy, second),
        3,
        "2 held, 1 refilled within the second"
    );
    assert_eq!(admitted_in_second(&mut envoy, 2 * second), 2);
    // Past its 10 s: the shipped fallback, ALLOW_ALL.
    assert_eq!(admitted_in_second(&mut envoy, 11 * second), 10);
    // A report counts what was decided since the last, over whole seconds.
    let report = envoy.periodic_report("edge", 12 * second).unwrap();
    let usage = &report.bucket_quota_usages[0];
    assert_eq!(
        (usage.num_requests_allowed, usage.num_requests_denied),
        (15, 15)
    );
    assert_eq!(usage.time_elapsed.unwrap().seconds, 12);
}
