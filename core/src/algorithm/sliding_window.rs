//! Sliding window: the current and the previous window's counters, the previous one weighted by
//! how much of it still overlaps the sliding window (the estimate Cloudflare published).
//!
//! Semantics (the contract `lua/sliding_window.lua` meets, with a string `<w>:<cur>:<prev>`):
//! - The window of time `t` is `floor(t / window)`. A stored window at or after the caller's is
//!   kept (late callers count into the newest window); the next one rolls `cur` into `prev`;
//!   any later one starts from zero.
//! - `elapsed = max(0, now - window_start)`, `weight = (window - elapsed) / window`,
//!   `estimate = prev * weight + cur`, a rational number, compared exactly.
//! - Admit when `estimate + cost <= limit`; then `cur += cost`. A denied request adds its cost
//!   only with `count_denied`, up to a current count of `2 x limit`.
//! - `remaining = floor(limit - estimate)` after the decision. `retry_after` of a denial is
//!   when the previous window's weight has decayed enough (or, if the current count alone is
//!   too high, the point in the next window where it has); `reset` is when both counters have
//!   slid out. The key expires then.
//!
//! Bound: an estimate, about `limit` per window when traffic is even; never more than the
//! fixed window's `2 x limit` in any interval of one window.

use super::exact::{ceil_div_nonneg, ceil_ms, ttl_ms};
use super::model::{Outcome, Request, Update};
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
    let window_us = limit.window().as_micros();
    let cap = limit.limit();
    let (index, current, previous) = {
        let index = req.now_us.div_euclid(window_us);
        match state {
            Some(s) if index <= s.window => (s.window, s.current, s.previous),
            Some(s) if index == s.window + 1 => (index, 0, s.current),
            _ => (index, 0, 0),
        }
    };
    let w = i128::from(window_us);
    let now = i128::from(req.now_us);
    let start = i128::from(index) * w;
    let elapsed = (now - start).max(0);
    // The previous window's weighted count, rounded up: `estimate + x <= limit` holds exactly
    // when `weighed + cur + x <= limit` for whole `x`, and `floor(limit - estimate)` is
    // `limit - weighed - cur`.
    let weighed = ceil_div_nonneg(i128::from(previous) * (w - elapsed), w);
    let to_next_window = start + w - now;
    let reset_us = |cur: u64| {
        if cur > 0 {
            to_next_window + w
        } else if previous > 0 {
            to_next_window
        } else {
            0
        }
    };

    if req.cost > cap {
        let verdict = Verdict::impossible(
            cap,
            cap.saturating_sub(weighed + current),
            ceil_ms(reset_us(current)),
        );
        return Outcome {
            verdict,
            update: Update::Keep,
        };
    }
    let allowed = weighed + current + req.cost <= cap;
    let new_current = if allowed {
        current + req.cost
    } else if req.count_denied {
        current.max((current + req.cost).min(2 * cap))
    } else {
        current
    };
    let retry_after_ms = if allowed {
        0
    } else {
        let cost = i128::from(req.cost);
        let cur = i128::from(new_current);
        let prev = i128::from(previous);
        let room = i128::from(cap) - cur - cost;
        if room >= 0 && previous > 0 {
            // Within this window, once `prev x (w - e) / w <= room`: at `e = w - room x w /
            // prev`, which is `to_next_window - room x w / prev` from now.
            ceil_div_nonneg(to_next_window * prev - room * w, prev * 1000)
        } else if new_current == 0 {
            ceil_ms(to_next_window)
        } else {
            // In the next window `cur` is the previous count: `cur x (w - e) / w + cost <=
            // limit` from `e = w - (limit - cost) x w / cur` on.
            let room = i128::from(cap) - cost;
            let into_next = (w * cur - room * w).max(0);
            ceil_div_nonneg(to_next_window * cur + into_next, cur * 1000)
        }
    };
    let verdict = Verdict {
        allowed,
        limit: cap,
        remaining: cap.saturating_sub(weighed + new_current),
        reset_ms: ceil_ms(reset_us(new_current)),
        retry_after_ms: Some(retry_after_ms),
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
            ttl_ms: ttl_ms(to_next_window + w),
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
        Request::one_at(ms * 1000)
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
