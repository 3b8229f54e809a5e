//! What a bucket funds, when, and what it assigns: on a fake clock (milliseconds given).

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
        matches: std::collections::BTreeMap::new(),
        quota: Quota::Limit(Limit::try_from(limit).unwrap()),
        share,
    }
}

fn id(key: &str) -> BucketId {
    BucketId::from_iter([("key", key)])
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
        crowded: false,
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

/// A bucket funded in full at its first report.
fn funded_first() -> Bucket {
    let mut b = Bucket::new("shop", &id("k"), &rule(Share::Demand), 0);
    b.funding_ask(0, Step::Report).unwrap();
    let first = b.funded(&grant(20, 20.0), 0).unwrap();
    b.sent(first, 0);
    b
}

/// A bucket funded in full at its first report, then reported `allowed` requests in 5 s.
fn reported(allowed: u64) -> Bucket {
    let mut b = funded_first();
    b.report(&usage(5, allowed, 0), 500);
    b
}

/// A bucket reported a request in 5 s, assigned its share at 1 s, and its quiet funding's ask
/// at 2 s.
fn gone_quiet() -> (Bucket, LeaseAsk) {
    let mut b = reported(1);
    let assignment = b.funded(&grant(20, 20.0), 1000).unwrap();
    b.sent(assignment, 1000);
    let quiet = b.funding_ask(2000, Step::Tick).expect("a span on");
    (b, quiet)
}

/// The grant of an ask crowded out of its ledger, whose first entry ends in `more_in_ms`.
fn crowded(more_in_ms: u64) -> LeaseGrant {
    LeaseGrant {
        crowded: true,
        more_in_ms,
        ..grant(0, 0.0)
    }
}

#[test]
fn each_refill_is_funded_before_it_is_assigned() {
    let mut b = Bucket::new("shop", &id("k"), &rule(Share::Demand), 0);
    let ask = b.funding_ask(0, Step::Report).unwrap();
    assert_eq!(ask.share_span_ms, 1000);
    assert_eq!(ask.demand, 20, "before any report: the whole rate");
    let first = b.funded(&grant(12, 12.5), 0).unwrap();
    let share = Assignment::TokenBucket(EnvoyTokenBucket {
        max_tokens: 12,
        tokens_per_fill: 25,
        fill_interval_s: 2,
    });
    assert_eq!(
        first, share,
        "the share's rate, holding only the whole units a second's funding grants"
    );
    let mut short = b.clone();
    assert_eq!(
        short.funded(&grant(7, 12.5), 0),
        Some(Assignment::TokenBucket(EnvoyTokenBucket {
            max_tokens: 7,
            tokens_per_fill: 7,
            fill_interval_s: 1
        })),
        "a funding short of the share: what was granted for a second"
    );
    b.sent(first, 0);
    assert_eq!(
        b.funding_ask(999, Step::Tick),
        None,
        "the algorithm has not made up the first funding yet"
    );
    let ask = b
        .funding_ask(1000, Step::Tick)
        .expect("the first refill, a span on");
    // A share of 12.5 is 12 whole tokens a second and half of one carried to the next.
    assert_eq!(ask.carry_per_k, 500, "the half the first funding left");
    assert_eq!(
        b.funded(&grant(13, 12.5), 1000),
        Some(share),
        "the same assignment, funding after funding"
    );
    assert_eq!(b.funding_ask(1400, Step::Tick), None, "funded for a second");
    let ask = b
        .funding_ask(1990, Step::Tick)
        .expect("a tick a little early");
    assert_eq!(
        (ask.share_span_ms, ask.carry_per_k),
        (1000, 0),
        "13 made up the half"
    );
    b.funded(&grant(12, 12.5), 2000);
    assert_eq!(b.funding_ask(3000, Step::Tick).unwrap().carry_per_k, 500);
    b.report(&usage(5, 40, 10), 3000);
    assert_eq!(
        b.funding_ask(3000, Step::Tick).unwrap().demand_per_ks,
        10_500,
        "offered 50 in 5 s, with its headroom"
    );
    assert_eq!(
        b.funded(&grant(0, 12.5), 3000),
        Some(Assignment::DenyAll),
        "the algorithm had nothing left"
    );
}

/// Fundings of a bucket first reported at `first_ms`, with reports every 5 s from then and
/// ticks every step, each `jitter` ms off: the times it was funded at.
fn fundings(first_ms: u64, jitter: impl Fn(u64) -> i64, until_ms: u64) -> Vec<u64> {
    let mut b = Bucket::new("shop", &id("k"), &rule(Share::Demand), first_ms);
    let mut events: Vec<(u64, Step)> = (1..)
        .map(|k| ((k * FUNDING_STEP_MS) as i64 + jitter(k)) as u64)
        .take_while(|&t| t < until_ms)
        .map(|t| (t, Step::Tick))
        .chain(
            (first_ms..until_ms)
                .step_by(5000)
                .map(|t| (t, Step::Report)),
        )
        .collect();
    events.sort_by_key(|&(t, step)| (t, step == Step::Tick));
    let mut funded = Vec::new();
    for (t, step) in events {
        if step == Step::Report {
            // Offered its whole share: a busy bucket, funded every span.
            b.report(&usage(5, 100, 0), t);
        }
        let ask = b.funding_ask(t, step);
        // The step orders what is due by this cheaper look, then asks: they must agree.
        assert_eq!(
            b.funding_due(t, step),
            ask.as_ref().map(|a| a.share_span_ms),
            "at {t} ms, {step:?}"
        );
        if ask.is_some() {
            let assignment = b.funded(&grant(20, 20.0), t).unwrap();
            b.sent(assignment, t);
            funded.push(t);
        }
    }
    funded
}

#[test]
fn a_bucket_is_funded_at_its_first_report_then_once_a_tick_at_every_phase() {
    // Double funding came from a report between two ticks funding a bucket again: its
    // second grant held what built up since the tick, and the next tick skipped it.
    for first_ms in (0..1000).step_by(25) {
        for jitter in [0i64, 9, -9, 40, -40] {
            let times = fundings(first_ms, |k| if k % 2 == 0 { jitter } else { 0 }, 30_000);
            let ticks_after: Vec<u64> = (1..=30)
                .map(|k| {
                    ((k * FUNDING_STEP_MS) as i64 + if k % 2 == 0 { jitter } else { 0 }) as u64
                })
                .filter(|&t| t >= first_ms + FUNDING_STEP_MS && t < 30_000)
                .collect();
            assert_eq!(times[0], first_ms, "funded at once when first reported");
            assert_eq!(
                times[1..],
                ticks_after[..],
                "first at {first_ms} ms, ticks {jitter} ms off: the first refill a span on, then one funding a tick, none at a report"
            );
        }
    }
}

#[test]
fn a_crowded_out_bucket_is_no_longer_quiet_and_asks_again_within_five_seconds() {
    let (mut b, quiet) = gone_quiet();
    b.funded(&grant(quiet.want, 20.0), 2000).unwrap();
    assert!(
        b.assignment_ttl_s(2000) > ASSIGNMENT_TTL_S,
        "quiet: its span and more"
    );
    // Its claim lapsed (a stalled stream), and others filled the ledger meanwhile.
    b.report(&usage(5, 1, 0), 30_000);
    b.crowded_out(&crowded(9_000), 30_000);
    assert_eq!(
        b.assignment_ttl_s(30_000),
        ASSIGNMENT_TTL_S,
        "no longer quiet"
    );
    assert_eq!(b.funding_ask(34_000, Step::Tick), None);
    assert!(
        b.funding_ask(35_000, Step::Tick).is_some(),
        "at most 5 s on"
    );
    b.report(&usage(5, 1, 0), 35_000);
    b.crowded_out(&crowded(300), 40_000);
    assert_eq!(b.funding_ask(40_500, Step::Report), None, "not at a report");
    assert!(
        b.funding_ask(41_000, Step::Tick).is_some(),
        "at least a tick on"
    );
}

#[test]
fn a_quiet_bucket_crowded_out_asks_for_its_share_a_step_at_a_time_when_it_gets_in() {
    let (mut b, quiet) = gone_quiet();
    assert_eq!(quiet.share_span_ms, 25_000, "quiet");
    b.report(&usage(5, 1, 0), 2000);
    b.crowded_out(&crowded(3000), 2000);
    let ask = b.funding_ask(5000, Step::Tick).expect("tried again");
    assert_eq!(
        (ask.want, ask.share_span_ms),
        (MAX_AMOUNT, FUNDING_STEP_MS),
        "its share over a step, not over the quiet span it no longer holds"
    );
}

#[test]
fn a_quiet_bucket_is_funded_for_long_spans_with_what_it_needs_and_assigned_through_them() {
    // A request in 5 s: a fifth of a request a second, against a share of 20.
    let mut b = reported(1);
    assert!(b.funding_ask(1000, Step::Tick).is_some());
    let assignment = b.funded(&grant(20, 20.0), 1000).unwrap();
    b.sent(assignment, 1000);
    let ask = b.funding_ask(2000, Step::Tick).expect("a span on");
    assert_eq!(
        (ask.want, ask.share_span_ms),
        (10, 25_000),
        "twice what it was offered, over as long as that is half the limit's 20 (25 s)"
    );
    let quiet = b.funded(&grant(10, 20.0), 2000).unwrap();
    assert_eq!(
        quiet,
        Assignment::TokenBucket(EnvoyTokenBucket {
            max_tokens: 2,
            tokens_per_fill: 2,
            fill_interval_s: 5
        }),
        "10 tokens in 25 s"
    );
    b.sent(quiet, 2000);
    // Looked at again within the 25 s, when its key says (so that buckets funded together
    // fall due apart).
    let next_ms = 2000 + staggered(25_000, &b.key);
    assert!((2000 + 18_750..=27_000).contains(&next_ms), "{next_ms}");
    for t in (3000..next_ms).step_by(1000) {
        if t % 5000 == 0 {
            b.report(&usage(5, 1, 0), t);
        }
        assert_eq!(
            b.funding_ask(t, Step::Tick),
            None,
            "funded until {next_ms} ms: {t}"
        );
    }
    assert_eq!(
        b.assignment_ttl_s(2000),
        (next_ms - 2000).div_ceil(1000) + ASSIGNMENT_TTL_S,
        "lives until its next funding, and the usual TTL on"
    );
    // Offered 10 a second: back to its share, at the next tick.
    b.report(&usage(5, 50, 0), 5500);
    let ask = b.funding_ask(6000, Step::Tick).expect("funded at once");
    assert_eq!((ask.want, ask.share_span_ms), (MAX_AMOUNT, 1000));
}

#[test]
fn steady_traffic_is_read_over_two_reports_and_a_change_at_once() {
    let mut b = Bucket::new("shop", &id("k"), &rule(Share::Demand), 0);
    b.report(&usage(5, 19, 0), 5000);
    let demand = |b: &Bucket| {
        b.funding_ask(b.last_reported_ms, Step::Tick)
            .unwrap()
            .demand_per_ks
    };
    assert_eq!(demand(&b), 3_990, "19 in 5 s, with its headroom");
    b.report(&usage(5, 21, 0), 10_000);
    assert_eq!(demand(&b), 4_200, "40 in 10 s: paced at 4 a second");
    b.report(&usage(5, 19, 0), 15_000);
    assert_eq!(demand(&b), 4_200);
    b.report(&usage(5, 200, 0), 20_000);
    assert_eq!(demand(&b), 42_000, "40 a second now: at once");
    b.report(&usage(5, 20, 0), 25_000);
    assert_eq!(demand(&b), 4_200, "and back");
}

#[test]
fn an_idle_bucket_is_funded_once_in_five_minutes_and_a_request_brings_it_back() {
    let mut b = reported(0);
    b.funded(&grant(20, 20.0), 1000);
    let ask = b.funding_ask(2000, Step::Tick).expect("a span on");
    assert_eq!(
        (ask.want, ask.share_span_ms),
        (5, IDLE_SPAN_MS),
        "offered nothing: a request a minute over five"
    );
    let idle = b.funded(&grant(5, 20.0), 2000).unwrap();
    assert_eq!(
        idle,
        Assignment::TokenBucket(EnvoyTokenBucket {
            max_tokens: 1,
            tokens_per_fill: 1,
            fill_interval_s: 60
        })
    );
    b.sent(idle, 2000);
    let next_ms = 2000 + staggered(IDLE_SPAN_MS, &b.key);
    for t in (3000..next_ms).step_by(5000) {
        assert_eq!(
            b.funding_ask(t, Step::Tick),
            None,
            "funded until {next_ms} ms: {t}"
        );
        b.report(&usage(5, 0, 0), t);
    }
    // One request in 5 s: more than one a minute pays for.
    b.report(&usage(5, 1, 0), 300_000);
    let ask = b
        .funding_ask(300_000, Step::Tick)
        .expect("funded anew at once");
    assert_eq!(ask.share_span_ms, FUNDING_STEP_MS);
}

#[test]
fn a_quiet_bucket_offered_more_than_its_funding_pays_for_is_funded_anew() {
    let mut b = reported(1);
    b.funded(&grant(20, 20.0), 1000);
    b.funding_ask(2000, Step::Tick).unwrap();
    let quiet = b.funded(&grant(10, 20.0), 2000).unwrap();
    b.sent(quiet, 2000);
    assert_eq!(
        b.funding_ask(6000, Step::Tick),
        None,
        "10 in 25 s: 0.4 a second"
    );
    // 3 in 5 s: under a quarter of its share, over what its funding pays for.
    b.report(&usage(5, 3, 0), 7000);
    assert!(b.funding_ask(7000, Step::Tick).is_some());
}

#[test]
fn quiet_buckets_funded_together_fall_due_apart_within_their_spans() {
    let keys: Vec<LimitKey> = (0..1000)
        .map(|i| crate::rlqs::bucket_key("shop", &id(&format!("client-{i}"))))
        .collect();
    let due: Vec<u64> = keys.iter().map(|k| staggered(20_000, k)).collect();
    assert!(due.iter().all(|&d| (15_000..=20_000).contains(&d)));
    for second in 15..20 {
        let falling = due.iter().filter(|&&d| d / 1000 == second).count();
        assert!(
            (150..=250).contains(&falling),
            "{falling} of 1,000 due in second {second} of 15 to 19"
        );
    }
    assert_eq!(
        due,
        keys.iter()
            .map(|k| staggered(20_000, k))
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_busy_bucket_is_assigned_for_the_usual_ttl_only() {
    let b = funded_first();
    assert_eq!(b.assignment_ttl_s(0), ASSIGNMENT_TTL_S);
}

#[test]
fn a_busy_share_is_funded_over_as_many_seconds_as_the_burst_holds() {
    let limit = |algorithm: &str, burst: u64| {
        let bucket = !algorithm.ends_with("window");
        Limit::try_from(RawLimit {
            algorithm: algorithm.into(),
            rate: bucket.then_some(10),
            per: bucket.then(|| Millis::new(1000)).flatten(),
            burst: bucket.then_some(burst),
            limit: (!bucket).then_some(10),
            window: (!bucket).then(|| Millis::new(1000)).flatten(),
            ..RawLimit::default()
        })
        .unwrap()
    };
    assert_eq!(busy_span_ms(&limit("gcra", 20)), 2000);
    assert_eq!(
        busy_span_ms(&limit("token_bucket", 29)),
        2000,
        "whole seconds"
    );
    assert_eq!(busy_span_ms(&limit("gcra", 10)), 1000);
    assert_eq!(busy_span_ms(&limit("gcra", 5)), 1000, "at least a second");
    assert_eq!(busy_span_ms(&limit("gcra", 1000)), MAX_BUSY_SPAN_MS);
    assert_eq!(busy_span_ms(&limit("sliding_window", 0)), 1000);

    let mut rule = rule(Share::Demand);
    rule.quota = Quota::Limit(limit("gcra", 20));
    let mut b = Bucket::new("shop", &id("k"), &rule, 0);
    assert_eq!(b.funding_ask(0, Step::Report).unwrap().share_span_ms, 1000);
    let first = b.funded(&grant(10, 10.0), 0).unwrap();
    b.sent(first, 0);
    let ask = b.funding_ask(1000, Step::Tick).expect("the first refill");
    assert_eq!(ask.share_span_ms, 2000, "then two seconds at a time");
    assert_eq!(
        b.funded(&grant(20, 10.0), 1000),
        Some(Assignment::TokenBucket(EnvoyTokenBucket {
            max_tokens: 10,
            tokens_per_fill: 10,
            fill_interval_s: 1
        })),
        "assigned the share's rate, as over one second"
    );
    assert_eq!(b.funding_ask(2400, Step::Tick), None);
    assert!(b.funding_ask(3000, Step::Tick).is_some());
}

#[test]
fn a_share_under_a_token_a_second_is_funded_over_the_span_it_fills_in() {
    let mut b = Bucket::new("shop", &id("k"), &rule(Share::Demand), 0);
    b.funding_ask(0, Step::Report).unwrap();
    assert_eq!(b.funded(&grant(0, 0.4), 0), None, "nothing to assign yet");
    let ask = b
        .funding_ask(0, Step::Report)
        .expect("funded again at once");
    assert_eq!(ask.share_span_ms, 5000, "2 tokens in 5 s are 0.4/s");
    let assignment = b.funded(&grant(2, 0.4), 0).unwrap();
    assert_eq!(
        assignment,
        Assignment::TokenBucket(EnvoyTokenBucket {
            max_tokens: 2,
            tokens_per_fill: 2,
            fill_interval_s: 5
        })
    );
    b.sent(assignment, 0);
    // The Envoy refills at 5 s, 10 s, ...: each is funded when it comes.
    assert_eq!(b.funding_ask(4000, Step::Tick), None);
    b.funding_ask(5000, Step::Tick)
        .expect("the first refill, a span on");
    b.funded(&grant(2, 0.4), 5000);
    assert_eq!(b.funding_ask(9000, Step::Tick), None);
    assert!(
        b.funding_ask(9600, Step::Tick).is_some(),
        "a tick a little early"
    );
}

#[test]
fn equal_shares_claim_alike_whatever_was_offered() {
    let mut b = Bucket::new("shop", &id("k"), &rule(Share::Equal), 0);
    b.report(&usage(5, 500, 0), 0);
    assert_eq!(b.funding_ask(0, Step::Report).unwrap().demand, 1);
    let mut d = Bucket::new("shop", &id("k"), &rule(Share::Demand), 0);
    d.report(&usage(5, 0, 0), 0);
    assert_eq!(
        d.funding_ask(0, Step::Report).unwrap().demand,
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
    assert_eq!(
        b.funding_ask(0, Step::Tick).unwrap().demand_per_ks,
        2_100,
        "the same rule: kept"
    );
    let allow = BucketRule {
        quota: Quota::AllowAll,
        ..rule(Share::Demand)
    };
    b.follow(&allow, 10);
    assert_eq!(b.blanket(), Some(Assignment::AllowAll));
    assert_eq!(b.funding_ask(10, Step::Tick), None);
    assert_eq!(b.last_sent(), Some(Assignment::DenyAll));
}
