//! One Envoy's quota filter, as Envoy 1.40 runs it (docs/rlqs.md, "What Envoy 1.40's filter
//! does"): a bucket cache shared by the Envoy's workers, each bucket decided by its assignment
//! (a blanket rule, or a token bucket refilling continuously at whole-second intervals), by
//! `no_assignment_behavior` before its first, and by `expired_assignment_behavior` once one
//! lapses; a new bucket reported at once, and every bucket every 5 s.

use std::collections::HashMap;

use sluice_server::envoy_api::protobuf::Duration as ProtoDuration;
use sluice_server::envoy_api::quota::{
    Action, BlanketRule, BucketId, BucketQuotaUsage, RateLimitQuotaResponse,
    RateLimitQuotaUsageReports, Strategy,
};

use super::config::{Blanket, BucketSettings, Expired};

/// Envoy 1.40 reports every 5 s, whatever `reporting_interval` says.
pub const REPORT_EVERY_US: i64 = 5_000_000;

/// A bucket id's entries, sorted by key.
pub type BucketKey = Vec<(String, String)>;

/// One Envoy's buckets.
#[derive(Debug, Default)]
pub struct QuotaEnvoy {
    buckets: HashMap<BucketKey, QuotaBucket>,
    /// Buckets made since the last report, to report at once.
    new: Vec<BucketKey>,
}

#[derive(Debug)]
struct QuotaBucket {
    allowed: u64,
    denied: u64,
    last_report_us: i64,
    assignment: Option<Held>,
}

#[derive(Debug)]
struct Held {
    rule: Enforced,
    /// When its time to live ends.
    expires_us: i64,
}

#[derive(Debug)]
enum Enforced {
    Blanket(Blanket),
    Tokens(TokenBucket),
}

/// A token bucket as Envoy's filter enforces it: `per_s` tokens a second, added continuously,
/// holding at most `max`.
#[derive(Debug)]
struct TokenBucket {
    max: f64,
    per_s: f64,
    tokens: f64,
    at_us: i64,
}

impl TokenBucket {
    fn take(&mut self, now_us: i64) -> bool {
        let elapsed_s = (now_us - self.at_us).max(0) as f64 / 1e6;
        self.tokens = (self.tokens + elapsed_s * self.per_s).min(self.max);
        self.at_us = self.at_us.max(now_us);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

impl QuotaEnvoy {
    /// Decides a request for bucket `key` (made with `settings`) at `now_us`: whether it
    /// passes.
    pub fn decide(&mut self, key: &BucketKey, settings: &BucketSettings, now_us: i64) -> bool {
        let bucket = match self.buckets.get_mut(key) {
            Some(bucket) => bucket,
            None => {
                self.new.push(key.clone());
                self.buckets.entry(key.clone()).or_insert(QuotaBucket {
                    allowed: 0,
                    denied: 0,
                    last_report_us: now_us,
                    assignment: None,
                })
            }
        };
        let allowed = match &mut bucket.assignment {
            None => settings.no_assignment == Blanket::AllowAll,
            Some(held) if now_us >= held.expires_us => match settings.expired {
                Expired::ReuseLast => enforce(&mut held.rule, now_us),
                Expired::Fallback { rule, timeout_s } => {
                    let until = held.expires_us.saturating_add(
                        i64::try_from(timeout_s.saturating_mul(1_000_000)).unwrap_or(i64::MAX),
                    );
                    if now_us < until {
                        rule == Blanket::AllowAll
                    } else {
                        settings.no_assignment == Blanket::AllowAll
                    }
                }
                Expired::NoAssignment => settings.no_assignment == Blanket::AllowAll,
            },
            Some(held) => enforce(&mut held.rule, now_us),
        };
        if allowed {
            bucket.allowed += 1;
        } else {
            bucket.denied += 1;
        }
        allowed
    }

    /// The report of the buckets made since the last, sent at once; `None` when there are none.
    pub fn new_buckets_report(
        &mut self,
        domain: &str,
        now_us: i64,
    ) -> Option<RateLimitQuotaUsageReports> {
        let new = std::mem::take(&mut self.new);
        self.report_of(domain, new, now_us)
    }

    /// The periodic report of every bucket; `None` when there are none.
    pub fn periodic_report(
        &mut self,
        domain: &str,
        now_us: i64,
    ) -> Option<RateLimitQuotaUsageReports> {
        self.new.clear();
        let keys: Vec<BucketKey> = self.buckets.keys().cloned().collect();
        self.report_of(domain, keys, now_us)
    }

    fn report_of(
        &mut self,
        domain: &str,
        keys: Vec<BucketKey>,
        now_us: i64,
    ) -> Option<RateLimitQuotaUsageReports> {
        let usages: Vec<BucketQuotaUsage> = keys
            .into_iter()
            .filter_map(|key| {
                let bucket = self.buckets.get_mut(&key)?;
                // Whole seconds, cut down, as Envoy counts them.
                let elapsed_s = (now_us - bucket.last_report_us).max(0) / 1_000_000;
                let usage = BucketQuotaUsage {
                    bucket_id: Some(BucketId {
                        bucket: key.into_iter().collect(),
                    }),
                    time_elapsed: Some(ProtoDuration {
                        seconds: elapsed_s,
                        nanos: 0,
                    }),
                    num_requests_allowed: bucket.allowed,
                    num_requests_denied: bucket.denied,
                };
                bucket.allowed = 0;
                bucket.denied = 0;
                bucket.last_report_us = now_us;
                Some(usage)
            })
            .collect();
        (!usages.is_empty()).then(|| RateLimitQuotaUsageReports {
            domain: domain.to_owned(),
            bucket_quota_usages: usages,
        })
    }

    /// Takes in the service's `responses`, arriving at `now_us`.
    pub fn apply(&mut self, responses: &[RateLimitQuotaResponse], now_us: i64) {
        for action in responses.iter().flat_map(|r| &r.bucket_action) {
            let Some(id) = &action.bucket_id else {
                continue;
            };
            let mut key: BucketKey = id
                .bucket
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            key.sort();
            match &action.bucket_action {
                Some(Action::AbandonAction(_)) => {
                    self.buckets.remove(&key);
                }
                Some(Action::QuotaAssignmentAction(assignment)) => {
                    let Some(bucket) = self.buckets.get_mut(&key) else {
                        continue;
                    };
                    // Without a time to live an assignment has no effect in Envoy 1.40.
                    let Some(ttl) = assignment.assignment_time_to_live else {
                        continue;
                    };
                    let expires_us = now_us.saturating_add(ttl.seconds.saturating_mul(1_000_000));
                    let strategy = assignment
                        .rate_limit_strategy
                        .as_ref()
                        .and_then(|s| s.strategy.as_ref());
                    let left = match &bucket.assignment {
                        Some(Held {
                            rule: Enforced::Tokens(old),
                            ..
                        }) => Some(old.tokens),
                        _ => None,
                    };
                    let rule = match strategy {
                        Some(Strategy::BlanketRule(rule))
                            if *rule == BlanketRule::DenyAll as i32 =>
                        {
                            Enforced::Blanket(Blanket::DenyAll)
                        }
                        Some(Strategy::TokenBucket(b)) => {
                            let max = f64::from(b.max_tokens);
                            let per_fill = f64::from(b.tokens_per_fill.map_or(1, |t| t.value));
                            // Whole seconds: a shorter interval is not enforced at all.
                            let interval_s = b.fill_interval.map_or(0, |d| d.seconds);
                            if interval_s < 1 {
                                Enforced::Blanket(Blanket::AllowAll)
                            } else {
                                Enforced::Tokens(TokenBucket {
                                    max,
                                    per_s: per_fill / interval_s as f64,
                                    // A replaced bucket keeps the tokens it had left.
                                    tokens: left.unwrap_or(max).min(max),
                                    at_us: now_us,
                                })
                            }
                        }
                        _ => Enforced::Blanket(Blanket::AllowAll),
                    };
                    bucket.assignment = Some(Held { rule, expires_us });
                }
                None => {}
            }
        }
    }
}

fn enforce(rule: &mut Enforced, now_us: i64) -> bool {
    match rule {
        Enforced::Blanket(blanket) => *blanket == Blanket::AllowAll,
        Enforced::Tokens(bucket) => bucket.take(now_us),
    }
}
