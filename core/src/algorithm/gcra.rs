//! GCRA, the generic cell rate algorithm: one stored time, the theoretical arrival time (TAT).
//!
//! Semantics (the contract `lua/gcra.lua` meets, with a string key holding the TAT): see
//! [`super::schedule`], which GCRA *is*: `interval = per / rate`, `tolerance = interval ×
//! burst`; a request conforms when `max(TAT − now, 0) + interval × cost ≤ tolerance`, and
//! then moves the TAT by `interval × cost`. A cost above `burst` can never conform: denied,
//! `retry_after` none. With `count_denied` a denial moves the TAT too, up to `now + 2 ×
//! tolerance`.
//!
//! This is redis-cell's `CL.THROTTLE key max_burst count period quantity` with
//! `max_burst = burst - 1`, `count = rate`, `period = per`, `quantity = cost`: redis-cell's
//! "limit" is `max_burst + 1`, our `burst`. redis-cell answers whole seconds, sluice
//! milliseconds; the decisions, `remaining` and the times (rounded up to the second) agree.
//!
//! Bound: `burst + rate x T` in any interval `T`.

use super::model::{Outcome, Request};
use super::schedule;
use crate::limit::BucketLimit;

/// The theoretical arrival time.
pub type State = schedule::Tat;

/// Decides one request; see the module documentation.
pub fn decide(limit: &BucketLimit, state: Option<&State>, req: Request) -> Outcome<State> {
    schedule::decide(limit, None, state, req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Update;
    use crate::limit::Limit;

    fn gcra(rate: u64, per: &str, burst: u64) -> BucketLimit {
        let json = format!(r#"{{"algorithm":"gcra","rate":{rate},"per":"{per}","burst":{burst}}}"#);
        match serde_json::from_str::<Limit>(&json).unwrap() {
            Limit::Gcra(b) => b,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_burst_passes_at_once_then_one_per_interval() {
        let l = gcra(10, "1s", 5);
        let mut state = None;
        let mut allowed = 0;
        for _ in 0..50 {
            let out = decide(&l, state.as_ref(), Request::one_at(1_000_000));
            if let Update::Write { state: s, .. } = out.update {
                state = Some(s);
            }
            allowed += u64::from(out.verdict.allowed);
        }
        assert_eq!(allowed, 5);
        let next = decide(&l, state.as_ref(), Request::one_at(1_000_000));
        assert_eq!(next.verdict.retry_after_ms, Some(100));
        assert_eq!(next.verdict.reset_ms, 500);
    }

    #[test]
    fn fractional_intervals_admit_the_whole_burst() {
        // 3 per second: an interval of 333333.33 us; float rounding must not cost the last one.
        let l = gcra(3, "1s", 3);
        let mut state = None;
        let now_us = 1_700_000_000_123_456;
        for i in 0..3 {
            let out = decide(&l, state.as_ref(), Request::one_at(now_us));
            assert!(out.verdict.allowed, "request {i}");
            if let Update::Write { state: s, .. } = out.update {
                state = Some(s);
            }
        }
    }

    #[test]
    fn remaining_is_exact_at_real_epoch_times() {
        // 49 per second, burst 4, two requests at one instant: exactly 2 remain. With the TAT
        // in an f64 near 1.7e15 us the floor landed on 1 at a few percent of the instants.
        let l = gcra(49, "1s", 4);
        for i in 0..10_000i64 {
            let now_us = 1_763_700_000_000_000 + i * 7_919;
            let first = decide(&l, None, Request::one_at(now_us));
            let Update::Write { state, .. } = first.update else {
                panic!("an admitted request writes")
            };
            let second = decide(&l, Some(&state), Request::one_at(now_us));
            assert_eq!(second.verdict.remaining, 2, "at {now_us}");
            assert_eq!(second.verdict.reset_ms, 41, "2 x 20408.16 us, rounded up");
        }
    }
}
