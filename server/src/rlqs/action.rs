//! Assignments as the protobuf bucket actions Envoy's filter takes.

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::google::protobuf::{Duration, UInt32Value};
use sluice_core::rlqs::bucket::Assignment;

/// The action assigning `assignment` to bucket `id` for `ttl_s` seconds
/// ([`sluice_core::rlqs::bucket::Bucket::assignment_ttl_s`]): Envoy ignores an assignment
/// without a time to live.
pub fn assign(
    id: &sluice_core::rlqs::BucketId,
    assignment: &Assignment,
    ttl_s: u64,
) -> BucketAction {
    let strategy = match assignment {
        Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
        Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
        Assignment::TokenBucket(bucket) => Strategy::TokenBucket(TokenBucket {
            max_tokens: bucket.max_tokens,
            tokens_per_fill: Some(UInt32Value {
                value: bucket.tokens_per_fill,
            }),
            fill_interval: Some(seconds(u64::from(bucket.fill_interval_s))),
        }),
    };
    BucketAction {
        bucket_id: Some(bucket_id(id)),
        bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(seconds(ttl_s)),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })),
    }
}

/// The action telling the Envoy to forget bucket `id`.
pub fn abandon(id: &sluice_core::rlqs::BucketId) -> BucketAction {
    BucketAction {
        bucket_id: Some(bucket_id(id)),
        bucket_action: Some(Action::AbandonAction(AbandonAction {})),
    }
}

fn bucket_id(id: &sluice_core::rlqs::BucketId) -> BucketId {
    BucketId {
        bucket: id
            .entries()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
    }
}

fn seconds(s: u64) -> Duration {
    Duration {
        seconds: i64::try_from(s).unwrap_or(i64::MAX),
        nanos: 0,
    }
}
