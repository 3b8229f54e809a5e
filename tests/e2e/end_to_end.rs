//! A request through the real .wasm, the real server and a real Redis.

use sluice_e2e::{Stack, header, request};
use sluice_sim::trace::TraceRecord;

/// A whole second, so that a fixed window starts exactly here.
const T: i64 = 1_763_700_000_000;
const CLIENT: &str = "203.0.113.5";

fn policy(limit: &str, failure_mode: &str) -> String {
    format!(
        r#"{{"cluster": "sluice", "timeout": "500ms", "failure_mode": "{failure_mode}",
            "rules": [{{"name": "per-ip", "match": {{"path": {{"prefix": "/api/"}}}},
                        "key": ["client_ip"], "limit": {limit}}}]}}"#
    )
}

const GCRA: &str = r#"{"algorithm": "gcra", "rate": 10, "per": "1s", "burst": 10}"#;
const FIXED_WINDOW: &str = r#"{"algorithm": "fixed_window", "limit": 10, "window": "1s"}"#;

fn burst_then_next_second() -> Vec<TraceRecord> {
    let mut records: Vec<TraceRecord> = (0..50).map(|_| request(T, CLIENT, "/api/items")).collect();
    records.extend((0..5).map(|_| request(T + 1000, CLIENT, "/api/items")));
    records
}

fn fifty_at_one_instant_admit_exactly_ten(limit: &str) {
    let stack = Stack::start(&policy(limit, "deny"));
    let done = stack.replay(&burst_then_next_second());
    assert_eq!(done.len(), 55);
    let (burst, next): (Vec<_>, Vec<_>) = done
        .iter()
        .partition(|d| d.started_ns == T as u64 * 1_000_000);
    let passed = burst.iter().filter(|d| d.status == 200).count();
    let limited: Vec<_> = burst.iter().filter(|d| d.status == 429).collect();
    assert_eq!(
        (passed, limited.len()),
        (10, 40),
        "statuses: {:?}",
        burst.iter().map(|d| d.status).collect::<Vec<_>>()
    );
    for denied in &limited {
        let retry_after: u64 = header(denied, "retry-after")
            .expect("a 429 carries Retry-After")
            .parse()
            .expect("seconds");
        assert!((1..=1).contains(&retry_after), "retry-after {retry_after}");
        assert_eq!(header(denied, "x-ratelimit-limit"), Some("10"));
        assert_eq!(header(denied, "x-ratelimit-remaining"), Some("0"));
    }
    assert!(
        next.iter().all(|d| d.status == 200),
        "the next second admits again: {:?}",
        next.iter().map(|d| d.status).collect::<Vec<_>>()
    );
}

#[test]
fn gcra_admits_exactly_ten_of_fifty_at_one_instant_and_the_next_second_admits_again() {
    fifty_at_one_instant_admit_exactly_ten(GCRA);
}

#[test]
fn fixed_window_admits_exactly_ten_of_fifty_at_one_instant_and_the_next_second_admits_again() {
    fifty_at_one_instant_admit_exactly_ten(FIXED_WINDOW);
}

#[test]
fn a_request_no_rule_matches_makes_no_callout() {
    let stack = Stack::start(&policy(GCRA, "deny"));
    let records: Vec<TraceRecord> = (0..30)
        .map(|_| request(T, CLIENT, "/static/app.css"))
        .collect();
    let done = stack.replay(&records);
    assert!(done.iter().all(|d| d.status == 200));
    assert!(
        done.iter().all(|d| d.filter_state.is_empty()),
        "no rule applied, so no decision record"
    );
}

#[test]
fn with_redis_stopped_the_failure_mode_decides() {
    for (mode, status) in [("allow", 200), ("deny", 503)] {
        let mut stack = Stack::start(&policy(GCRA, mode));
        stack.redis.kill();
        let done = stack.replay(&burst_then_next_second());
        let statuses: Vec<u16> = done.iter().map(|d| d.status).collect();
        assert!(
            statuses.iter().all(|s| *s == status),
            "failure_mode {mode}: {statuses:?}"
        );
        let record = done[0]
            .filter_state
            .iter()
            .find(|(k, _)| k.as_slice() == b"wasm.sluice.decision")
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .expect("a decision record");
        assert!(record.contains(r#""outcome":"failed""#), "{record}");
    }
}
