//! `gcra` decides as redis-cell's `CL.THROTTLE` does, on vectors written down here.
//!
//! Parameter mapping: `CL.THROTTLE key max_burst count period quantity` is sluice's
//! `{"algorithm": "gcra", "burst": max_burst + 1, "rate": count, "per": "<period>s"}` with
//! `cost = quantity`. redis-cell's `limit` (its answer's second field) is `max_burst + 1`, our
//! `limit`; its `remaining` is ours; its `retry_after` and `reset_after` are whole seconds (the
//! command) or exact durations (its library): ours are milliseconds, and `-1` (never) is our
//! `retry_after_ms: None`, reported for allowed requests as 0.
//!
//! The first table is redis-cell's own test of its rate limiter (`src/cell/mod.rs`,
//! `it_rate_limits`: `max_burst` 4, 1 per second); the second is the example of its README
//! (`CL.THROTTLE user123 15 30 60`). Each vector is decided by the Lua script on a real Redis
//! (replay time) and by the reference model; both must give redis-cell's numbers.

use crate::common;

use sluice_core::algorithm::{Request, State, Update};
use sluice_core::limit::Limit;
use sluice_harness::RedisServer;
use sluice_server::scripts::{ScriptCall, ScriptTime};
use sluice_server::store::Topology;

/// (ms after start, quantity, limited, remaining, reset_after ms, retry_after ms or -1)
type Vector = (i64, u64, bool, u64, u64, i64);

const CELL_TEST: [Vector; 15] = [
    (0, 6, true, 5, 0, -1), // more than the maximum can never pass
    (0, 1, false, 4, 1000, -1),
    (0, 1, false, 3, 2000, -1),
    (0, 1, false, 2, 3000, -1),
    (0, 1, false, 1, 4000, -1),
    (0, 1, false, 0, 5000, -1),
    (0, 1, true, 0, 5000, 1000),
    (3000, 1, false, 2, 3000, -1),
    (3100, 1, false, 1, 3900, -1),
    (4000, 1, false, 1, 4000, -1),
    (8000, 1, false, 4, 1000, -1),
    (9500, 1, false, 4, 1000, -1),
    (9500, 0, false, 4, 1000, -1), // quantity 0 only peeks
    (9500, 2, false, 2, 3000, -1),
    (9500, 5, true, 2, 3000, 3000),
];

/// `CL.THROTTLE user123 15 30 60` answers `0 16 15 -1 2` (seconds).
const CELL_README: [Vector; 1] = [(0, 1, false, 15, 2000, -1)];

fn expected_retry(retry: i64, limited: bool) -> Option<u64> {
    match (retry, limited) {
        (-1, true) => None,
        (-1, false) => Some(0),
        (ms, _) => Some(ms as u64),
    }
}

async fn check(limit: &Limit, key: &str, vectors: &[Vector]) {
    let redis = RedisServer::start().unwrap();
    let store = common::connected_store(Topology::Standalone(redis.url())).await;
    let start: i64 = 1_763_700_000_000_000;
    let mut state: Option<State> = None;
    for (i, &(at_ms, quantity, limited, remaining, reset_ms, retry)) in vectors.iter().enumerate() {
        let now = start + at_ms * 1000;
        let script = store
            .run(&ScriptCall::new(
                limit,
                key.to_owned(),
                ScriptTime::Replay(now),
                quantity,
                false,
            ))
            .await
            .unwrap();
        let model = limit.decide(
            state.as_ref(),
            Request {
                now_us: now,
                cost: quantity,
                count_denied: false,
            },
        );
        if let Update::Write { state: s, .. } = model.update {
            state = Some(s);
        }
        assert_eq!(script, model.verdict, "vector {i}: script and model");
        let v = script;
        assert_eq!(
            (
                v.allowed,
                v.limit,
                v.remaining,
                v.reset_ms,
                v.retry_after_ms
            ),
            (
                !limited,
                limit.capacity(),
                remaining,
                reset_ms,
                expected_retry(retry, limited)
            ),
            "vector {i} ({at_ms} ms, quantity {quantity})"
        );
    }
}

#[tokio::test]
async fn gcra_matches_redis_cells_own_rate_limiter_test() {
    // max_burst 4, 1 token per second.
    let limit = common::limit(r#"{"algorithm":"gcra","rate":1,"per":"1s","burst":5}"#);
    check(&limit, "cell-test", &CELL_TEST).await;
}

#[tokio::test]
async fn gcra_matches_the_example_in_redis_cells_readme() {
    // CL.THROTTLE user123 15 30 60: max_burst 15, 30 per 60 s.
    let limit = common::limit(r#"{"algorithm":"gcra","rate":30,"per":"60s","burst":16}"#);
    check(&limit, "user123", &CELL_README).await;
}
