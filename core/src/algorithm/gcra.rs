//! GCRA, the generic cell rate algorithm: one stored time, the theoretical arrival time (TAT).
//!
//! Semantics (the contract `lua/gcra.lua` meets, with a string key holding the TAT):
//! - `interval = per / rate` (microseconds per unit, fractional if need be) and
//!   `tolerance = interval x burst`. An absent key has `tat = now`.
//! - `excess = max(tat - now, 0)` is how far the key runs ahead of schedule; the request's
//!   `new_excess = excess + interval x cost`. Admit when `new_excess <= tolerance` (within
//!   [`TIME_EPSILON_US`]); then `tat = now + new_excess`. A late caller sees a larger excess:
//!   lagging clocks can only be denied more.
//! - A cost above `burst` can never conform: denied, `retry_after` none.
//! - `retry_after` of a denial is `new_excess - tolerance`; `reset` (the key's time to live) is
//!   the excess after the decision; `remaining = floor((tolerance - excess) / interval)`.
//! - With `count_denied` a denial moves the TAT too, up to `now + 2 x tolerance`.
//!
//! This is redis-cell's `CL.THROTTLE key max_burst count period quantity` with
//! `max_burst = burst - 1`, `count = rate`, `period = per`, `quantity = cost`: redis-cell's
//! "limit" is `max_burst + 1`, our `burst`. redis-cell answers whole seconds, sluice
//! milliseconds; the decisions, `remaining` and the times (rounded up to the second) agree.
//!
//! Bound: `burst + rate x T` in any interval `T`.

use super::{Outcome, Request, TIME_EPSILON_US, Update, ceil_ms, floor_units, ttl_ms};
use crate::limit::BucketLimit;
use crate::verdict::Verdict;

/// The theoretical arrival time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct State {
    /// Microseconds since the epoch; fractional when `interval` is.
    pub tat: f64,
}

/// Decides one request; see the module documentation.
pub fn decide(limit: &BucketLimit, state: Option<&State>, req: Request) -> Outcome<State> {
    let interval = limit.interval_us();
    let tolerance = interval * limit.burst() as f64;
    let now = req.now_us as f64;
    let tat = state.map_or(now, |s| s.tat);
    let excess = (tat - now).max(0.0);
    let remaining = |excess: f64| floor_units((tolerance - excess) / interval);

    if req.cost > limit.burst() {
        let verdict = Verdict::impossible(limit.burst(), remaining(excess), ceil_ms(excess));
        return Outcome {
            verdict,
            update: Update::Keep,
        };
    }
    let new_excess = excess + interval * req.cost as f64;
    let allowed = new_excess <= tolerance + TIME_EPSILON_US;
    let kept_excess = if allowed {
        new_excess
    } else if req.count_denied {
        new_excess.min(2.0 * tolerance)
    } else {
        excess
    };
    let retry_after_us = if allowed { 0.0 } else { new_excess - tolerance };
    let verdict = Verdict {
        allowed,
        limit: limit.burst(),
        remaining: remaining(kept_excess),
        reset_ms: ceil_ms(kept_excess),
        retry_after_ms: Some(ceil_ms(retry_after_us)),
        delay_ms: 0,
    };
    let update = if req.cost == 0 || !(allowed || req.count_denied) {
        Update::Keep
    } else {
        Update::Write {
            state: State {
                tat: now + kept_excess,
            },
            ttl_ms: ttl_ms(kept_excess),
        }
    };
    Outcome { verdict, update }
}

#[cfg(test)]
mod tests {
    use super::*;
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
            let out = decide(
                &l,
                state.as_ref(),
                Request {
                    now_us: 1_000_000,
                    cost: 1,
                    count_denied: false,
                },
            );
            if let Update::Write { state: s, .. } = out.update {
                state = Some(s);
            }
            allowed += u64::from(out.verdict.allowed);
        }
        assert_eq!(allowed, 5);
        let next = decide(
            &l,
            state.as_ref(),
            Request {
                now_us: 1_000_000,
                cost: 1,
                count_denied: false,
            },
        );
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
            let out = decide(
                &l,
                state.as_ref(),
                Request {
                    now_us,
                    cost: 1,
                    count_denied: false,
                },
            );
            assert!(out.verdict.allowed, "request {i}");
            if let Update::Write { state: s, .. } = out.update {
                state = Some(s);
            }
        }
    }
}
