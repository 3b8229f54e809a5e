//! Sliding window: the current and the previous window's counters, the previous one weighted by
//! how much of it still overlaps the sliding window (the estimate Cloudflare published).
//!
//! Semantics (the contract `lua/sliding_window.lua` meets, with a hash `{w, cur, prev}`):
//! - The window of time `t` is `floor(t / window)`. A stored window at or after the caller's is
//!   kept (late callers count into the newest window); the next one rolls `cur` into `prev`;
//!   any later one starts from zero.
//! - `elapsed = max(0, now - window_start)`, `weight = (window - elapsed) / window`,
//!   `estimate = prev * weight + cur`.
//! - Admit when `estimate + cost <= limit` (within [`AMOUNT_EPSILON`]); then `cur += cost`.
//!   A denied request adds its cost only with `count_denied`.
//! - `remaining = floor(limit - estimate)` after the decision. `retry_after` of a denial is
//!   when the previous window's weight has decayed enough (or, if the current count alone is
//!   too high, the point in the next window where it has); `reset` is when both counters have
//!   slid out. The key expires then.
//!
//! Bound: an estimate, about `limit` per window when traffic is even; never more than the
//! fixed window's `2 x limit` in any interval of one window.

use super::{AMOUNT_EPSILON, Outcome, Request, Update, ceil_ms, floor_units, ttl_ms};
use crate::limit::WindowLimit;
use crate::verdict::Verdict;

/// The two counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// The current window's index.
    pub window: i64,
    /// Units counted in the current window.
    pub current: u64,
    /// Units counted in the window before it.
    pub previous: u64,
}

/// Decides one request; see the module documentation.
pub fn decide(limit: &WindowLimit, state: Option<&State>, req: Request) -> Outcome<State> {
    let w = limit.window().as_micros();
    let cap = limit.limit();
    let now = req.now_us;
    let index = now.div_euclid(w);
    let (index, current, previous) = match state {
        Some(s) if index <= s.window => (s.window, s.current, s.previous),
        Some(s) if index == s.window + 1 => (index, 0, s.current),
        _ => (index, 0, 0),
    };
    let wf = w as f64;
    let elapsed = (now - index * w).max(0) as f64;
    let weight = (wf - elapsed) / wf;
    let prev = previous as f64;
    let estimate = |cur: u64| prev * weight + cur as f64;
    let reset_us = |cur: u64| {
        if cur > 0 {
            ((index + 2) * w - now) as f64
        } else if previous > 0 {
            ((index + 1) * w - now) as f64
        } else {
            0.0
        }
    };

    if req.cost > cap {
        let verdict = Verdict::impossible(
            cap,
            floor_units(cap as f64 - estimate(current)),
            ceil_ms(reset_us(current)),
        );
        return Outcome {
            verdict,
            update: Update::Keep,
        };
    }
    let allowed = estimate(current) + req.cost as f64 <= cap as f64 + AMOUNT_EPSILON;
    let new_current = if allowed || req.count_denied {
        current + req.cost
    } else {
        current
    };
    let retry_after_us = if allowed {
        0.0
    } else {
        let cost = req.cost as f64;
        let cur = new_current as f64;
        let room = cap as f64 - cur - cost;
        let at = if room >= 0.0 && previous > 0 {
            // Within this window, once prev's weight has fallen to `room`.
            (index * w) as f64 + (wf - room * wf / prev)
        } else {
            // In the next window `cur` becomes the previous count.
            let room = cap as f64 - cost;
            let next_start = ((index + 1) * w) as f64;
            if new_current == 0 {
                next_start
            } else {
                next_start + (wf - room * wf / cur).max(0.0)
            }
        };
        (at - now as f64).max(0.0)
    };
    let verdict = Verdict {
        allowed,
        limit: cap,
        remaining: floor_units(cap as f64 - estimate(new_current)),
        reset_ms: ceil_ms(reset_us(new_current)),
        retry_after_ms: Some(ceil_ms(retry_after_us)),
        delay_ms: 0,
    };
    let update = if new_current == current {
        Update::Keep
    } else {
        Update::Write {
            state: State {
                window: index,
                current: new_current,
                previous,
            },
            ttl_ms: ttl_ms(((index + 2) * w - now) as f64),
        }
    };
    Outcome { verdict, update }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Limit;

    fn window(limit: u64) -> WindowLimit {
        let json = format!(r#"{{"algorithm":"sliding_window","limit":{limit},"window":"1s"}}"#);
        match serde_json::from_str::<Limit>(&json).unwrap() {
            Limit::SlidingWindow(w) => w,
            other => panic!("{other:?}"),
        }
    }

    fn req(ms: i64) -> Request {
        Request {
            now_us: ms * 1000,
            cost: 1,
            count_denied: false,
        }
    }

    #[test]
    fn the_previous_window_weighs_by_its_overlap() {
        let l = window(10);
        let full = State {
            window: 0,
            current: 10,
            previous: 0,
        };
        // 250 ms into window 1, window 0's 10 weigh 7.5: two more fit, a third does not.
        let out = decide(&l, Some(&full), req(1250));
        assert!(out.verdict.allowed);
        let Update::Write { state, .. } = out.update else {
            panic!()
        };
        assert_eq!(
            state,
            State {
                window: 1,
                current: 1,
                previous: 10
            }
        );
        let out = decide(&l, Some(&state), req(1250));
        assert!(out.verdict.allowed);
        let Update::Write { state, .. } = out.update else {
            panic!()
        };
        let out = decide(&l, Some(&state), req(1250));
        assert!(!out.verdict.allowed);
        // 7.5 + 2 + 1 > 10 until the weight falls to 0.7: 300 ms into the window.
        assert_eq!(out.verdict.retry_after_ms, Some(50));
    }

    #[test]
    fn a_current_count_at_the_limit_waits_into_the_next_window() {
        let l = window(4);
        let state = State {
            window: 0,
            current: 4,
            previous: 0,
        };
        let out = decide(&l, Some(&state), req(500));
        assert!(!out.verdict.allowed);
        // In window 1, 4 * weight + 1 <= 4 once weight <= 0.75: at 1250 ms.
        assert_eq!(out.verdict.retry_after_ms, Some(750));
        assert_eq!(out.verdict.reset_ms, 1500);
    }
}
