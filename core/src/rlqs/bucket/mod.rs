//! One bucket as one Envoy reports it: what it is offered, when its share of the limit is next
//! funded, and the assignment it was last sent.
//!
//! Each Envoy (one quota stream) is a holder in the bucket's lease ledger (`lua/ledger.lua`).
//! Every refill of the token bucket it is assigned is funded before it is assigned: once per
//! fill interval the server asks the ledger for the Envoy's share of the limit's rate over
//! that interval, and the algorithm grants the units out of its own state, as it would grant
//! them to requests. The Envoy is then assigned a token bucket refilling at most what was
//! granted. What all Envoys' buckets admit is so funded by the algorithm, refill by refill; the
//! bound this gives is in `docs/algorithms.md`.
//!
//! Times are milliseconds on any clock the caller keeps; nothing here reads one.

use self::demand::steady_demand;
pub use self::demand::{DEMAND_HEADROOM, LEAST_DEMAND_PER_S, STEADY_WITHIN};
use self::span::staggered;
pub use self::span::{
    FUNDING_STEP_MS, IDLE_SPAN_MS, MAX_BUSY_SPAN_MS, MAX_QUIET_SPAN_MS, QUIET_SPAN_MS,
    REFILL_EARLY_MS, busy_span_ms,
};
use super::envoy_bucket::{EnvoyTokenBucket, MAX_FILL_INTERVAL_S};
use super::report::Usage;
use super::{BucketId, BucketRule, Quota, Share};
use crate::duration::Millis;
use crate::key::{LimitKey, RuleName};
use crate::limit::{Limit, MAX_AMOUNT};
use crate::wire::{LeaseAsk, LeaseGrant, LeaseTerms, share_over_span};

/// How long an assignment lasts at the Envoy unless renewed. Envoy counts whole seconds, and
/// keeps enforcing an assignment this long after the server last spoke: through a restart of
/// the server or an outage of Redis.
pub const ASSIGNMENT_TTL_S: u64 = 10;

const ASSIGNMENT_TTL: Millis = match Millis::new(ASSIGNMENT_TTL_S * 1000) {
    Some(ttl) => ttl,
    None => panic!("the assignment TTL is not zero"),
};

/// Why the stream looks at its buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Its once-a-step tick: every bucket due is funded.
    Tick,
    /// A report came in: only a bucket never assigned is funded, at once (until then its
    /// Envoy serves it by its `no_assignment_behavior`). The others wait for the tick, so
    /// that however reports fall between ticks, one funding pays for one refill.
    Report,
}

/// An assignment is sent again when this much of its time to live has passed, though nothing
/// changed: well before it lapses, even if a renewal is lost.
pub const RENEW_AFTER_MS: u64 = ASSIGNMENT_TTL_S * 1000 / 3;

// Renewed twice before it lapses.
const _: () = assert!(RENEW_AFTER_MS * 2 < ASSIGNMENT_TTL_S * 1000);

/// A bucket its Envoy has not reported for this long is no longer funded: Envoy reports every
/// bucket it knows every 5 s, so a stream that missed two reports is not an Envoy serving it.
/// Its assignment lapses at the Envoy; a report brings it back.
pub const SILENT_AFTER_MS: u64 = 12_000;

/// A bucket is *quiet* when its share is at least this many times what its Envoy was offered
/// (its last report's requests a second).
pub const QUIET_SHARE_FACTOR: f64 = 4.0;

/// The longest a bucket crowded out of its ledger (its bucket shared by as many streams as the
/// server allows) waits before it asks again; its Envoy applies its no_assignment_behavior
/// meanwhile.
pub const CROWDED_RETRY_MS: u64 = 5_000;

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
    /// The requests its last report that covered any time showed, and the milliseconds it
    /// covered.
    last_window: Option<(u64, u64)>,
    /// When a report last showed a request.
    last_used_ms: u64,
    /// When a report last named it.
    last_reported_ms: u64,
    /// When its share is next funded. The first funding (at a report) fills the Envoy's bucket;
    /// its first refill is funded at the first tick a whole span later, when the algorithm has
    /// made up what the first funding took (an earlier one would find it short, and assign
    /// the Envoy less than its share); after that, one span after the last funding was due
    /// (not after it was made), so fundings keep to the ticks.
    next_funding_ms: u64,
    /// Whether a refill has been funded since the first funding.
    refilling: bool,
    /// Whether it is funded as a quiet bucket (see [`QUIET_SPAN_MS`]).
    quiet: bool,
    /// Requests a second its last funding pays for: a quiet bucket offered more is funded
    /// again at once.
    funded_per_s: f64,
    /// The share of the limit's rate the last funding gave it, in requests a second.
    share_per_s: f64,
    /// The time a funding covers: the fill interval of the token bucket it pays for.
    funding_span_ms: u64,
    /// Thousandths of a unit of its share that its fundings, in whole units, left over (see
    /// [`share_over_span`]).
    carry_per_k: u64,
    /// What the Envoy was last sent, and when.
    sent: Option<(Assignment, u64)>,
}

impl Bucket {
    /// A bucket first reported at `now_ms`, given its quota by `rule`.
    pub fn new(domain: &str, id: &BucketId, rule: &BucketRule, now_ms: u64) -> Bucket {
        Bucket::under(rule, super::bucket_key(domain, id), now_ms)
    }

    fn under(rule: &BucketRule, key: LimitKey, now_ms: u64) -> Bucket {
        Bucket {
            rule: rule.name.clone(),
            quota: rule.quota,
            share: rule.share,
            key,
            demand_per_s: None,
            last_window: None,
            last_used_ms: now_ms,
            last_reported_ms: now_ms,
            next_funding_ms: now_ms,
            refilling: false,
            quiet: false,
            funded_per_s: 0.0,
            share_per_s: 0.0,
            funding_span_ms: 1000,
            carry_per_k: 0,
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
        // (Its first report, which made it, covers no time.)
        let since_last_ms = now_ms.saturating_sub(self.last_reported_ms);
        let covered_ms = usage.covered_ms(Some(since_last_ms));
        if covered_ms > 0 {
            let window = (usage.offered(), covered_ms);
            let demand = steady_demand(self.last_window, window);
            self.last_window = Some(window);
            self.demand_per_s = Some(demand);
            let over = demand * QUIET_SHARE_FACTOR > self.share_per_s || demand > self.funded_per_s;
            if self.quiet && over {
                // Offered more than a quiet bucket is funded for: funded anew from the next
                // tick (its share, or a quiet funding of what it is offered now).
                self.fund_share_from(now_ms);
            }
        }
        if usage.allowed > 0 || usage.denied > 0 {
            self.last_used_ms = now_ms;
        }
        self.last_reported_ms = now_ms;
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

    /// The ask that funds its next refill, if one is due at a `step` at `now_ms`. A tick a
    /// little early (under half a step) finds its funding due.
    pub fn funding_ask(&self, now_ms: u64, step: Step) -> Option<LeaseAsk> {
        let Quota::Limit(limit) = self.quota else {
            return None;
        };
        self.funding_due(now_ms, step)?;
        let want = match self.quiet_want() {
            Some(want) if self.quiet => want,
            _ => MAX_AMOUNT,
        };
        let carry_per_k = if want == MAX_AMOUNT {
            self.carry_per_k
        } else {
            0
        };
        Some(LeaseAsk {
            carry_per_k,
            ..self.ask(limit, want, self.demand_per_ks(&limit))
        })
    }

    /// Whether a refill is due at a `step` at `now_ms` (what [`Bucket::funding_ask`] would
    /// fund): the span its funding would cover, if so. Cheaper than the ask, for a step
    /// that orders what is due before it asks.
    pub fn funding_due(&self, now_ms: u64, step: Step) -> Option<u64> {
        if !matches!(self.quota, Quota::Limit(_)) || self.silent(now_ms) {
            return None;
        }
        let due = match step {
            Step::Tick if self.refilling => now_ms + REFILL_EARLY_MS >= self.next_funding_ms,
            Step::Tick => now_ms >= self.next_funding_ms,
            Step::Report => self.sent.is_none() && now_ms >= self.next_funding_ms,
        };
        due.then_some(self.funding_span_ms)
    }

    /// What a quiet funding asks for: twice what the Envoy was offered over the span, at least
    /// two requests and a request a minute; `None` before a report has shown what it is
    /// offered.
    fn quiet_want(&self) -> Option<u64> {
        let offered = self.demand_per_s?;
        let span_s = self.quiet_span_ms() as f64 / 1000.0;
        let over_span = (offered * 2.0 * span_s).ceil();
        let least = (span_s / f64::from(MAX_FILL_INTERVAL_S)).ceil().max(2.0);
        Some((over_span.max(least) as u64).min(MAX_AMOUNT))
    }

    /// How long a quiet funding covers: [`IDLE_SPAN_MS`] for a bucket offered nothing since its
    /// last report; else the whole seconds over which twice what it was offered is half the
    /// limit's capacity, from [`QUIET_SPAN_MS`] to [`MAX_QUIET_SPAN_MS`] (so that a
    /// quiet funding finds what it asks for twice over at once).
    fn quiet_span_ms(&self) -> u64 {
        match (self.demand_per_s, self.quota) {
            (Some(offered), _) if offered <= 0.0 => IDLE_SPAN_MS,
            (Some(offered), Quota::Limit(limit)) => {
                // (A float cast to u64 saturates.)
                let fitting_s = (limit.capacity() as f64 / (4.0 * offered)).floor();
                ((fitting_s * 1000.0) as u64).clamp(QUIET_SPAN_MS, MAX_QUIET_SPAN_MS)
            }
            _ => QUIET_SPAN_MS,
        }
    }

    fn silent(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.last_reported_ms) > SILENT_AFTER_MS
    }

    /// How long the assignment sent at `now_ms` lives at the Envoy: [`ASSIGNMENT_TTL_S`] past
    /// the time its funding pays until. A busy bucket is funded every few seconds, within that;
    /// a quiet bucket's funding pays for its whole span, through which its assignment then
    /// lives without being sent again (an Envoy copies its whole bucket cache for every
    /// response it takes in, so 180,000 quiet buckets renewed every 3.3 s cost the server and
    /// each Envoy 54,000 actions a second for nothing).
    pub fn assignment_ttl_s(&self, now_ms: u64) -> u64 {
        let paid_ms = if self.quiet {
            self.next_funding_ms.saturating_sub(now_ms)
        } else {
            0
        };
        ASSIGNMENT_TTL_S.saturating_add(paid_ms.div_ceil(1000))
    }

    /// The ask that takes this Envoy's claim to a share out of the ledger (its stream ended),
    /// so that the others' shares grow at their next funding; `None` for a blanket bucket.
    pub fn withdrawal_ask(&self) -> Option<LeaseAsk> {
        let Quota::Limit(limit) = self.quota else {
            return None;
        };
        Some(self.ask(limit, 0, 0))
    }

    fn ask(&self, limit: Limit, want: u64, demand_per_ks: u64) -> LeaseAsk {
        LeaseAsk {
            rule: self.rule.clone(),
            key: self.key.clone(),
            limit,
            terms: LeaseTerms {
                max_units: MAX_AMOUNT,
                max_outstanding: MAX_AMOUNT,
                // The ledger counts the Envoy's demand as long as its assignment may live.
                ttl: ASSIGNMENT_TTL,
            },
            want,
            held: 0,
            returning: 0,
            demand: demand_per_ks.div_ceil(1000),
            share_span_ms: self.funding_span_ms,
            demand_per_ks,
            carry_per_k: 0,
            max_holders: 0,
        }
    }

    /// What this Envoy claims a share by, in units a thousand seconds: for `share: equal` the
    /// same as every other's; else what it was offered with [`DEMAND_HEADROOM`], at least
    /// [`LEAST_DEMAND_PER_S`], or the whole rate before that is known.
    fn demand_per_ks(&self, limit: &Limit) -> u64 {
        let max = MAX_AMOUNT.saturating_mul(1000);
        match (self.share, self.demand_per_s) {
            (Share::Equal, _) => 1000,
            (Share::Demand, Some(demand)) => {
                let claimed = (demand * DEMAND_HEADROOM).max(LEAST_DEMAND_PER_S);
                ((claimed * 1000.0).ceil() as u64).min(max)
            }
            (Share::Demand, None) => {
                let (units, period) = limit.nominal_rate();
                (units.saturating_mul(1_000_000) / period.as_millis().max(1)).clamp(1, max)
            }
        }
    }

    /// The assignment a funding answered by `grant` at `now_ms` pays for; `None` when there
    /// is nothing to assign yet: the share needs a longer span to fund a whole token, and is
    /// funded again at once over that span (and for a blanket bucket, which is never funded).
    pub fn funded(&mut self, grant: &LeaseGrant, now_ms: u64) -> Option<Assignment> {
        let Quota::Limit(limit) = self.quota else {
            return None;
        };
        let share_per_s = grant.share_per_ks as f64 / 1000.0;
        let span_ms = self.funding_span_ms;
        // The span in which the share funds whole tokens, as Envoy refills them: whole seconds
        // for a share of a request a second or more ([`busy_span_ms`]; what a span's share has
        // over whole units is carried to the next), else the interval in which it makes one.
        let wanted_span_ms = if share_per_s >= 1.0 {
            busy_span_ms(&limit)
        } else {
            EnvoyTokenBucket::at_most(share_per_s, 0)
                .map_or(span_ms, |b| u64::from(b.fill_interval_s) * 1000)
        };
        self.share_per_s = share_per_s;
        // Quiet when its share is far above what it is offered, and the algorithm holds what
        // a quiet funding asks for twice over at once: a long span is funded out of what the
        // algorithm has at that instant. A quiet funding granted less goes back to the share.
        let was_quiet = self.quiet;
        // What a funding of the share left over of a whole unit goes to the next; a grant
        // short of the share (the algorithm had no more) carries nothing.
        let (whole, carried) = share_over_span(grant.share_per_ks, span_ms, self.carry_per_k);
        let paid_in_full = !was_quiet && grant.granted >= whole;
        self.carry_per_k = if paid_in_full && wanted_span_ms == span_ms {
            carried
        } else {
            0
        };
        self.quiet = match (self.demand_per_s, self.quiet_want()) {
            (Some(offered), Some(want)) => {
                share_per_s >= QUIET_SHARE_FACTOR * offered
                    && want.saturating_mul(2) <= limit.capacity()
                    && !(was_quiet && grant.granted < want)
            }
            _ => false,
        };
        self.funding_span_ms = if self.quiet {
            wanted_span_ms.max(self.quiet_span_ms())
        } else {
            wanted_span_ms
        };
        if grant.granted == 0 && wanted_span_ms != span_ms {
            self.next_funding_ms = now_ms;
            return None;
        }
        self.next_funding_ms = if self.sent.is_none() {
            // The first funding filled the Envoy's bucket: its first refill is funded a whole
            // span on.
            now_ms.saturating_add(span_ms)
        } else {
            // One span on from when this one was due; a stream that stalled (or could not
            // fund) makes up at most one span, funding at each tick until it has.
            self.refilling = true;
            let cycle_ms = if was_quiet {
                staggered(span_ms, &self.key)
            } else {
                span_ms
            };
            self.next_funding_ms
                .saturating_add(cycle_ms)
                .max(now_ms.saturating_sub(span_ms))
        };
        // A share funded in full is assigned as the share: its rate, holding its whole units
        // of a second (what every funding grants at least; the fractions the fundings carry
        // make up the rest), so that the assignment holds still from one funding to the next
        // (Envoy builds a new bucket for each changed one). Else what was granted, over the span.
        self.funded_per_s = grant.granted as f64 * 1000.0 / span_ms as f64;
        let bucket = if paid_in_full && share_per_s >= 1.0 {
            EnvoyTokenBucket::at_most_holding(share_per_s, share_per_s.floor() as u32)
        } else {
            EnvoyTokenBucket::at_most(self.funded_per_s, 0)
        };
        Some(match bucket {
            Some(bucket) => Assignment::TokenBucket(bucket),
            None => Assignment::DenyAll,
        })
    }

    /// Takes in that the bucket's ledger had no room for this Envoy's stream (`grant` is
    /// crowded out): nothing is assigned, and it asks again when the first of the other
    /// streams' claims would end, within [`CROWDED_RETRY_MS`].
    pub fn crowded_out(&mut self, grant: &LeaseGrant, now_ms: u64) {
        let wait_ms = grant.more_in_ms.clamp(FUNDING_STEP_MS, CROWDED_RETRY_MS);
        // Its claim lapsed from the ledger, and what a quiet funding paid for with it: once in,
        // it is funded its share a step at a time, as a new bucket is.
        self.fund_share_from(now_ms.saturating_add(wait_ms));
    }

    /// Puts the bucket back on fundings of its share, one step at a time, from `at_ms`.
    fn fund_share_from(&mut self, at_ms: u64) {
        self.quiet = false;
        self.funding_span_ms = FUNDING_STEP_MS;
        self.next_funding_ms = at_ms;
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

mod demand;
mod span;
#[cfg(test)]
mod tests;
