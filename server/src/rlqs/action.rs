//! Assignments as the protobuf bucket actions Envoy's filter takes.

use sluice_core::rlqs::bucket::Assignment;

use crate::envoy_api::protobuf::{Duration, UInt32Value};
use crate::envoy_api::quota::{
    AbandonAction, Action, BlanketRule, BucketAction, BucketId, QuotaAssignmentAction,
    RateLimitStrategy, Strategy, TokenBucket,
};

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

#[cfg(test)]
mod tests {
    use sluice_core::rlqs::envoy_bucket::EnvoyTokenBucket;

    use super::*;

    fn id() -> sluice_core::rlqs::BucketId {
        sluice_core::rlqs::BucketId::from_iter([("name", "per-key"), ("key", "k1")])
    }

    fn assignment(action: &BucketAction) -> &QuotaAssignmentAction {
        match &action.bucket_action {
            Some(Action::QuotaAssignmentAction(a)) => a,
            other => panic!("not an assignment: {other:?}"),
        }
    }

    #[test]
    fn a_token_bucket_is_sent_as_envoy_reads_it_with_the_ttl_given() {
        let bucket = EnvoyTokenBucket {
            max_tokens: 10,
            tokens_per_fill: 3,
            fill_interval_s: 2,
        };
        let action = assign(&id(), &Assignment::TokenBucket(bucket), 35);
        assert_eq!(
            action.bucket_id.as_ref().map(|b| b.bucket.len()),
            Some(2),
            "every entry of the bucket id, as the Envoy reported it"
        );
        let a = assignment(&action);
        assert_eq!(
            a.assignment_time_to_live.map(|d| (d.seconds, d.nanos)),
            Some((35, 0))
        );
        let Some(Strategy::TokenBucket(tb)) =
            a.rate_limit_strategy.as_ref().and_then(|s| s.strategy)
        else {
            panic!("not a token bucket: {a:?}");
        };
        assert_eq!(tb.max_tokens, 10);
        assert_eq!(tb.tokens_per_fill.map(|t| t.value), Some(3));
        assert_eq!(tb.fill_interval.map(|d| (d.seconds, d.nanos)), Some((2, 0)));
    }

    #[test]
    fn blanket_quotas_are_blanket_rules_and_abandon_is_its_own_action() {
        for (quota, rule) in [
            (Assignment::AllowAll, BlanketRule::AllowAll),
            (Assignment::DenyAll, BlanketRule::DenyAll),
        ] {
            let action = assign(&id(), &quota, 10);
            let strategy = assignment(&action)
                .rate_limit_strategy
                .as_ref()
                .and_then(|s| s.strategy);
            assert_eq!(strategy, Some(Strategy::BlanketRule(rule as i32)));
        }
        assert!(matches!(
            abandon(&id()).bucket_action,
            Some(Action::AbandonAction(_))
        ));
    }

    #[test]
    fn a_ttl_past_what_protobuf_holds_is_the_longest_it_holds() {
        assert_eq!(seconds(u64::MAX).seconds, i64::MAX);
    }
}
