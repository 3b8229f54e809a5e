//! One bucket as one Envoy reports it: what it is offered, when its share of the limit is next
//! funded, and the assignment it was last sent.
//!
//! Each Envoy (one quota stream) is a holder in the bucket's lease ledger (`lua/lease.lua`).
//! Every refill of the token bucket it is assigned is funded before it is assigned: once per
//! fill interval the server asks the ledger for the Envoy's share of the limit's rate over
//! that interval, and the algorithm grants the units out of its own state, as it would grant
//! them to requests. The Envoy is then assigned a token bucket refilling at most what was
//! granted. What all Envoys' buckets admit is so funded by the algorithm, refill by refill; the
//! bound this gives is in `docs/algorithms.md`.
//!
//! Times are milliseconds on any clock the caller keeps; nothing here reads one.

use std::collections::BTreeMap;

use super::report::Usage;
use super::token_bucket::EnvoyTokenBucket;
use super::{BucketRule, Quota, Share};
use crate::duration::Millis;
use crate::key::{LimitKey, RuleName};
use crate::limit::{Limit, MAX_AMOUNT};
use crate::wire::{LeaseAsk, LeaseGrant, LeaseTerms};

/// How long an assignment lasts at the Envoy unless renewed. Envoy counts whole seconds, and
/// keeps enforcing an assignment this long after the server last spoke: through a restart of
/// the server or an outage of Redis.
pub const ASSIGNMENT_TTL_S: u64 = 10;

const ASSIGNMENT_TTL: Millis = match Millis::new(ASSIGNMENT_TTL_S * 1000) {
    Some(ttl) => ttl,
    None => panic!("the assignment TTL is not zero"),
};

/// How often the server looks at a stream's buckets: fundings happen on these steps.
pub const FUNDING_STEP_MS: u64 = 1000;

/// An assignment is sent again when this much of its time to live has passed, though nothing
/// changed: well before it lapses, even if a renewal is lost.
pub const RENEW_AFTER_MS: u64 = ASSIGNMENT_TTL_S * 1000 / 3;

// Renewed twice before it lapses.
const _: () = assert!(RENEW_AFTER_MS * 2 < ASSIGNMENT_TTL_S * 1000);

/// What an Envoy is told to do with a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignment {
    /// Admit every request (`ALLOW_ALL`).
    AllowAll,
    /// Deny every request (`DENY_ALL`).
    DenyAll,
    /// Admit what this token bucket holds.
    TokenBucket(EnvoyTokenBucket),
}

impl Assignment {
    /// Its name in metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Assignment::AllowAll => "allow_all",
            Assignment::DenyAll => "deny_all",
            Assignment::TokenBucket(_) => "token_bucket",
        }
    }

    /// The requests a second it admits; `None` for no limit.
    pub fn rate_per_s(&self) -> Option<f64> {
        match self {
            Assignment::AllowAll => None,
            Assignment::DenyAll => Some(0.0),
            Assignment::TokenBucket(b) => Some(b.rate_per_s()),
        }
    }
}

/// One bucket of one domain at one Envoy.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    /// The rule that gives it its quota.
    pub rule: RuleName,
    /// Its quota.
    pub quota: Quota,
    share: Share,
    /// Its limit's key: the domain and the bucket id.
    pub key: LimitKey,
    /// Requests a second offered at this Envoy, from its last report; `None` before the first
    /// report that covered any time.
    demand_per_s: Option<f64>,
    /// When a report last showed a request.
    last_used_ms: u64,
    /// When its share is next funded: one span after the last funding was due (not after it
    /// was made), so that a bucket funded between the stream's steps, at a report, is funded
    /// at every step after, not every other one.
    next_funding_ms: u64,
    /// The time a funding covers: the fill interval of the token bucket it pays for.
    funding_span_ms: u64,
    /// What the Envoy was last sent, and when.
    sent: Option<(Assignment, u64)>,
}

impl Bucket {
    /// A bucket first reported at `now_ms`, given its quota by `rule`.
    pub fn new(
        domain: &str,
        id: &BTreeMap<String, String>,
        rule: &BucketRule,
        now_ms: u64,
    ) -> Bucket {
        Bucket::under(rule, super::bucket_key(domain, id), now_ms)
    }

    fn under(rule: &BucketRule, key: LimitKey, now_ms: u64) -> Bucket {
        Bucket {
            rule: rule.name.clone(),
            quota: rule.quota,
            share: rule.share,
            key,
            demand_per_s: None,
            last_used_ms: now_ms,
            next_funding_ms: now_ms,
            funding_span_ms: 1000,
            sent: None,
        }
    }

    /// Whether `rule` gives it the quota it has; when not (the configuration changed), it
    /// starts over under `rule`, remembering what the Envoy was last sent.
    pub fn follow(&mut self, rule: &BucketRule, now_ms: u64) {
        if self.rule != rule.name || self.quota != rule.quota || self.share != rule.share {
            *self = Bucket {
                sent: self.sent,
                ..Bucket::under(rule, self.key.clone(), now_ms)
            };
        }
    }

    /// Takes in a report of its use at `now_ms`.
    pub fn report(&mut self, usage: &Usage, now_ms: u64) {
        if let Some(demand) = usage.demand_per_s() {
            self.demand_per_s = Some(demand);
        }
        if usage.allowed > 0 || usage.denied > 0 {
            self.last_used_ms = now_ms;
        }
    }

    /// Whether no report has shown a request for `idle_after`: the Envoy may forget it.
    pub fn idle(&self, now_ms: u64, idle_after: Millis) -> bool {
        now_ms.saturating_sub(self.last_used_ms) >= idle_after.as_millis()
    }

    /// The assignment that needs no funding, for a bucket allowed or denied whole; `None` for
    /// a limited one.
    pub fn blanket(&self) -> Option<Assignment> {
        match self.quota {
            Quota::AllowAll => Some(Assignment::AllowAll),
            Quota::DenyAll => Some(Assignment::DenyAll),
            Quota::Limit(_) => None,
        }
    }

    /// The ask that funds its next refill, if one is due at `now_ms`.
    pub fn funding_ask(&self, now_ms: u64) -> Option<LeaseAsk> {
        let Quota::Limit(limit) = self.quota else {
            return None;
        };
        (now_ms >= self.next_funding_ms).then(|| LeaseAsk {
            rule: self.rule.clone(),
            key: self.key.clone(),
            limit,
            terms: LeaseTerms {
                max_units: MAX_AMOUNT,
                max_outstanding: MAX_AMOUNT,
                // The ledger counts the Envoy's demand as long as its assignment may live.
                ttl: ASSIGNMENT_TTL,
            },
            want: MAX_AMOUNT,
            held: 0,
            returning: 0,
            demand: self.demand(&limit),
            share_span_ms: self.funding_span_ms,
        })
    }

    /// Units a second this Envoy claims a share by: for `share: equal` the same as every
    /// other's; else what it was offered, or the whole rate before that is known, and at
    /// least one, so that a bucket it still knows keeps a share to admit a first request.
    fn demand(&self, limit: &Limit) -> u64 {
        match (self.share, self.demand_per_s) {
            (Share::Equal, _) => 1,
            (Share::Demand, Some(demand)) => (demand.ceil() as u64).clamp(1, MAX_AMOUNT),
            (Share::Demand, None) => {
                let (units, period) = limit.nominal_rate();
                (units.saturating_mul(1000) / period.as_millis().max(1)).clamp(1, MAX_AMOUNT)
            }
        }
    }

    /// The assignment a funding answered by `grant` at `now_ms` pays for; `None` when there
    /// is nothing to assign yet: the share needs a longer span to fund a whole token, and is
    /// funded again at once over that span.
    pub fn funded(&mut self, grant: &LeaseGrant, now_ms: u64) -> Option<Assignment> {
        let share_per_s = grant.share_per_ks as f64 / 1000.0;
        let span_ms = self.funding_span_ms;
        // The span in which the share funds whole tokens, as Envoy refills them.
        let wanted_span_ms = EnvoyTokenBucket::at_most(share_per_s, 0)
            .map_or(span_ms, |b| u64::from(b.fill_interval_s) * 1000);
        self.funding_span_ms = wanted_span_ms;
        if grant.granted == 0 && wanted_span_ms != span_ms {
            self.next_funding_ms = now_ms;
            return None;
        }
        // The next is one span on from when this one was due; a stream that stalled (or could
        // not fund) makes up at most one span, funding at each step until it has.
        self.next_funding_ms = self
            .next_funding_ms
            .saturating_add(span_ms)
            .max(now_ms.saturating_sub(span_ms));
        let funded_per_s = grant.granted as f64 * 1000.0 / span_ms as f64;
        Some(match EnvoyTokenBucket::at_most(funded_per_s, 0) {
            Some(bucket) => Assignment::TokenBucket(bucket),
            None => Assignment::DenyAll,
        })
    }

    /// Whether `assignment` is to be sent at `now_ms`: it is new, or the last one sent is due
    /// for renewal.
    pub fn due(&self, assignment: &Assignment, now_ms: u64) -> bool {
        match self.sent {
            Some((sent, at_ms)) => {
                sent != *assignment || now_ms.saturating_sub(at_ms) >= RENEW_AFTER_MS
            }
            None => true,
        }
    }

    /// Records that `assignment` was sent at `now_ms`.
    pub fn sent(&mut self, assignment: Assignment, now_ms: u64) {
        self.sent = Some((assignment, now_ms));
    }

    /// What the Envoy was last sent.
    pub fn last_sent(&self) -> Option<Assignment> {
        self.sent.map(|(a, _)| a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::RawLimit;

    fn rule(share: Share) -> BucketRule {
        let limit = RawLimit {
            algorithm: "gcra".into(),
            rate: Some(20),
            per: Millis::new(1000),
            burst: Some(20),
            ..RawLimit::default()
        };
        BucketRule {
            name: RuleName::new("per-key").unwrap(),
            matches: BTreeMap::new(),
            quota: Quota::Limit(Limit::try_from(limit).unwrap()),
            share,
        }
    }

    fn id(key: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("key".to_owned(), key.to_owned())])
    }

    fn grant(granted: u64, share_per_s: f64) -> LeaseGrant {
        LeaseGrant {
            granted,
            lease_ms: ASSIGNMENT_TTL_S * 1000,
            more_in_ms: 0,
            limit: 20,
            remaining: 0,
            pace_us: 0,
            kept: None,
            share_per_ks: (share_per_s * 1000.0) as u64,
        }
    }

    fn usage(elapsed_s: u64, allowed: u64, denied: u64) -> Usage {
        Usage {
            bucket: id("k"),
            elapsed_s,
            allowed,
            denied,
        }
    }

    #[test]
    fn each_refill_is_funded_before_it_is_assigned() {
        let mut b = Bucket::new("shop", &id("k"), &rule(Share::Demand), 0);
        let ask = b.funding_ask(0).unwrap();
        assert_eq!(ask.share_span_ms, 1000);
        assert_eq!(ask.demand, 20, "before any report: the whole rate");
        assert_eq!(
            b.funded(&grant(12, 12.5), 0),
            Some(Assignment::TokenBucket(EnvoyTokenBucket {
                max_tokens: 12,
                tokens_per_fill: 12,
                fill_interval_s: 1
            })),
            "what was granted for a second, not the share"
        );
        assert_eq!(b.funding_ask(999), None, "funded for a second");
        assert!(b.funding_ask(1000).is_some());
        b.report(&usage(5, 40, 10), 1000);
        assert_eq!(b.funding_ask(1000).unwrap().demand, 10, "offered 50 in 5 s");
        assert_eq!(
            b.funded(&grant(0, 12.5), 1000),
            Some(Assignment::DenyAll),
            "the algorithm had nothing left"
        );
    }

    #[test]
    fn a_bucket_funded_between_steps_is_funded_at_every_step_after() {
        // A report at 300 ms funds the bucket off the stream's steps, which come each second
        // a few milliseconds late or early.
        let mut b = Bucket::new("shop", &id("k"), &rule(Share::Demand), 300);
        b.funding_ask(300).unwrap();
        b.funded(&grant(20, 20.0), 300);
        let step = |k: u64| k * FUNDING_STEP_MS + [3, 0, 9, 1][k as usize % 4];
        assert_eq!(b.funding_ask(step(1)), None, "funded 0.7 s before");
        let mut funded = 0;
        for step in (2..=21).map(step) {
            if b.funding_ask(step).is_some() {
                b.funded(&grant(20, 20.0), step);
                funded += 1;
            }
        }
        assert_eq!(funded, 20, "one funding a step, as the span is one step");
    }

    #[test]
    fn a_share_under_a_token_a_second_is_funded_over_the_span_it_fills_in() {
        let mut b = Bucket::new("shop", &id("k"), &rule(Share::Demand), 0);
        b.funding_ask(0).unwrap();
        assert_eq!(b.funded(&grant(0, 0.4), 0), None, "nothing to assign yet");
        let ask = b.funding_ask(0).expect("funded again at once");
        assert_eq!(ask.share_span_ms, 5000, "2 tokens in 5 s are 0.4/s");
        assert_eq!(
            b.funded(&grant(2, 0.4), 0),
            Some(Assignment::TokenBucket(EnvoyTokenBucket {
                max_tokens: 2,
                tokens_per_fill: 2,
                fill_interval_s: 5
            }))
        );
        assert_eq!(b.funding_ask(4999), None);
    }

    #[test]
    fn equal_shares_claim_alike_whatever_was_offered() {
        let mut b = Bucket::new("shop", &id("k"), &rule(Share::Equal), 0);
        b.report(&usage(5, 500, 0), 0);
        assert_eq!(b.funding_ask(0).unwrap().demand, 1);
        let mut d = Bucket::new("shop", &id("k"), &rule(Share::Demand), 0);
        d.report(&usage(5, 0, 0), 0);
        assert_eq!(
            d.funding_ask(0).unwrap().demand,
            1,
            "a bucket kept keeps a claim"
        );
    }

    #[test]
    fn an_assignment_is_sent_when_it_changes_or_is_due_for_renewal() {
        let mut b = Bucket::new("shop", &id("k"), &rule(Share::Demand), 0);
        let deny = Assignment::DenyAll;
        assert!(b.due(&deny, 0));
        b.sent(deny, 0);
        assert!(!b.due(&deny, RENEW_AFTER_MS - 1));
        assert!(b.due(&deny, RENEW_AFTER_MS));
        assert!(b.due(&Assignment::AllowAll, 1));
    }

    #[test]
    fn a_bucket_is_idle_after_reports_show_no_request_for_the_time_set() {
        let idle_after = Millis::new(60_000).unwrap();
        let mut b = Bucket::new("shop", &id("k"), &rule(Share::Demand), 0);
        b.report(&usage(5, 0, 0), 30_000);
        assert!(!b.idle(59_999, idle_after));
        b.report(&usage(5, 0, 1), 40_000);
        assert!(!b.idle(99_999, idle_after), "a denied request is a use");
        assert!(b.idle(100_000, idle_after));
    }

    #[test]
    fn a_changed_rule_starts_the_bucket_over_and_remembers_what_was_sent() {
        let mut b = Bucket::new("shop", &id("k"), &rule(Share::Demand), 0);
        b.report(&usage(5, 10, 0), 0);
        b.sent(Assignment::DenyAll, 0);
        b.follow(&rule(Share::Demand), 10);
        assert_eq!(b.funding_ask(0).unwrap().demand, 2, "the same rule: kept");
        let allow = BucketRule {
            quota: Quota::AllowAll,
            ..rule(Share::Demand)
        };
        b.follow(&allow, 10);
        assert_eq!(b.blanket(), Some(Assignment::AllowAll));
        assert_eq!(b.funding_ask(10), None);
        assert_eq!(b.last_sent(), Some(Assignment::DenyAll));
    }
}
