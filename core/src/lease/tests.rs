use super::*;

const MS: u64 = 1000;

fn config(horizon_ms: u64, max_units: u64) -> LeaseConfig {
    LeaseConfig {
        horizon: Millis::new(horizon_ms).unwrap(),
        terms: LeaseTerms {
            max_units,
            max_outstanding: max_units * 4,
            ttl: Millis::new(1000).unwrap(),
        },
    }
}

fn grant(granted: u64, lease_ms: u64, more_in_ms: u64) -> LeaseGrant {
    LeaseGrant {
        granted,
        lease_ms,
        more_in_ms,
        limit: 100,
        remaining: 40,
        pace_us: 0,
        kept: None,
        share_per_ks: 0,
        crowded: false,
    }
}

#[test]
fn allowances_round_trip_and_garbage_is_a_free_slot() {
    let mut a = Allowance::new("r:key|with|bars");
    a.grant(100 * MS, &grant(5, 1000, 0));
    a.observe(1, 150 * MS, Millis::new(200).unwrap());
    let record = a.encode();
    assert_eq!(Allowance::decode(&record), Some(a));
    let mut bad_id = record.clone();
    bad_id.push(0xff);
    let mut other_tag = record.clone();
    other_tag[0] = b'5';
    for bad in [
        &b""[..],
        b"1|2",
        b"5|0|0|0|0|0|0|0|0|0|0|0|r:key",
        &[0xff, 0xfe],
        &record[..60],
        &bad_id,
        &other_tag,
    ] {
        assert_eq!(Allowance::decode(bad), None, "{bad:?}");
    }
    let mut no_id = Allowance::new("");
    no_id.units = 3;
    assert_eq!(Allowance::decode(&no_id.encode()), Some(no_id));
}

#[test]
fn a_busy_key_asks_for_two_horizons_when_less_than_one_is_left() {
    let c = config(100, 1_000);
    let mut a = Allowance::new("r:k");
    a.observe(1, 0, c.horizon);
    assert_eq!(a.want(0, &c), None, "a key seen once is not leased");
    for t in 1..30 {
        a.observe(1, t * MS, c.horizon);
    }
    assert_eq!(a.want(30 * MS, &c), Some(60));
    a.asking_since_us = 30 * MS;
    assert_eq!(a.want(31 * MS, &c), None, "one ask at a time");
    a.grant(30 * MS, &grant(60, 1_000, 0));
    assert_eq!(a.want(32 * MS, &c), None, "two horizons held");
    a.units = 20;
    assert_eq!(a.want(40 * MS, &c), Some(40));
    a.units = 0;
    assert_eq!(
        a.want(40 * MS, &config(100, 25)),
        Some(25),
        "capped by max_units"
    );
}

#[test]
fn the_rate_counts_the_last_full_period() {
    let h = Millis::new(100).unwrap();
    let mut a = Allowance::new("r:k");
    for t in 0..50 {
        a.observe(2, t * MS, h);
    }
    a.observe(1, 120 * MS, h);
    assert_eq!((a.seen_before, a.seen, a.expected()), (100, 1, 100));
    a.observe(1, 500 * MS, h);
    assert_eq!(a.expected(), 1, "a long silence forgets the old rate");
}

#[test]
fn units_are_spent_only_while_the_lease_lives() {
    let mut a = Allowance::new("r:k");
    a.grant(1_000 * MS, &grant(3, 500, 0));
    assert_eq!(a.take(2, 1_200 * MS), Take::Taken);
    assert_eq!(a.take(2, 1_200 * MS), Take::Short, "one left");
    assert!(a.give_back(2, 1_300 * MS));
    assert_eq!(a.take(3, 1_499 * MS), Take::Taken);
    assert!(!a.give_back(1, 1_500 * MS), "the lease ended");
}

#[test]
fn a_new_lease_covers_only_the_units_the_server_counts() {
    // The lease ended (a renewal failed) with 5 units unspent: the next ask says none are
    // held, and its grant of 8 leaves 8, not 13.
    let mut a = Allowance::new("r:k");
    a.grant(0, &grant(5, 1_000, 0));
    assert_eq!(a.held(999 * MS), 5);
    assert_eq!(a.held(1_000 * MS), 0, "the lease ended");
    a.grant(1_200 * MS, &grant(8, 1_000, 0));
    assert_eq!(a.units, 8);
    // A renewal of 8 held that reached the server after their lease ended there: of the
    // 8, spent down to 6 meanwhile, the holder keeps what the server kept, and the grant.
    assert_eq!(a.take(2, 2_100 * MS), Take::Taken);
    a.grant(
        2_150 * MS,
        &LeaseGrant {
            kept: Some(0),
            ..grant(4, 1_000, 0)
        },
    );
    assert_eq!(a.units, 4);
    a.grant(
        2_160 * MS,
        &LeaseGrant {
            kept: Some(3),
            ..grant(0, 1_000, 0)
        },
    );
    assert_eq!(a.units, 3);
    a.grant(2_170 * MS, &grant(2, 1_000, 0));
    assert_eq!(a.units, 5, "all counted: all kept");
}

#[test]
fn a_short_answer_stops_asking_until_the_server_said() {
    let c = config(100, 10);
    let mut a = Allowance::new("r:k");
    for t in 0..10 {
        a.observe(1, t * MS, c.horizon);
    }
    a.grant(10 * MS, &grant(0, 1_000, 250));
    assert_eq!(a.next_ask_us, 260 * MS);
    assert_eq!(a.want(100 * MS, &c), None);
    assert!(a.want(260 * MS, &c).is_some());
}

#[test]
fn a_key_over_its_limit_is_spent_at_the_pace_the_server_gave() {
    let t0 = 1_000_000 * MS;
    let mut a = Allowance::new("r:k");
    a.grant(t0, &grant(100, 1_000, 0));
    assert_eq!(a.pace_us, 0, "granted in full: spent freely");
    assert_eq!(a.take(100, t0), Take::Taken);
    // 300 of 1000 wanted, and a fair share of one unit every 250 us.
    a.grant(
        t0,
        &LeaseGrant {
            pace_us: 250,
            ..grant(300, 1_000, 20)
        },
    );
    assert_eq!((a.units, a.pace_us), (300, 250));
    // Requests every 50 us: one every 250 us gets through, after the slack.
    let offered = (0..1_000).map(|i| t0 + i * 50);
    let spent = offered.filter(|&t| a.take(1, t) == Take::Taken).count();
    assert_eq!(
        spent,
        200 + PACE_SLACK as usize,
        "50 ms at one per 250 us, and the slack"
    );
    // After a quiet moment, no more than the slack at once.
    let later = t0 + 500 * MS;
    let at_once = (0..1_000)
        .filter(|_| a.take(1, later) == Take::Taken)
        .count();
    assert_eq!(at_once, 1 + PACE_SLACK as usize);
    a.grant(t0 + 200 * MS, &grant(10, 1_000, 0));
    assert_eq!(a.pace_us, 0, "demand within the rate again: free");
}

#[test]
fn a_lease_about_to_end_is_renewed_while_used_and_given_back_when_quiet() {
    let h = Millis::new(100).unwrap();
    let mut a = Allowance::new("r:k");
    a.grant(0, &grant(5, 1_000, 0));
    a.observe(1, 10 * MS, h);
    let ttl = 1_000 * MS;
    assert_eq!(
        a.lease_ending(500 * MS, ttl, 50 * MS),
        None,
        "half a lease to run"
    );
    assert_eq!(
        a.lease_ending(960 * MS, ttl, 50 * MS),
        Some(Ending::GiveBack)
    );
    a.observe(1, 700 * MS, h);
    assert_eq!(a.lease_ending(960 * MS, ttl, 50 * MS), Some(Ending::Renew));
    a.asking_since_us = 960 * MS;
    assert_eq!(
        a.lease_ending(970 * MS, ttl, 50 * MS),
        None,
        "being renewed"
    );
    a.asking_since_us = 0;
    assert_eq!(a.take_all(), 5);
    assert_eq!(a.lease_ending(970 * MS, ttl, 50 * MS), None, "nothing held");
}
