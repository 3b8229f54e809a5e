//! Fixed window: one counter per window of `window` aligned to the Unix epoch.
//!
//! Semantics (the contract `lua/fixed_window.lua` meets):
//! - The window of time `t` is `floor(t / window)`. The key stores that index and a count.
//!   A stored index at or after the caller's is kept (late callers count into the newest
//!   window); an older one is a window that is over, and counts as zero.
//! - Admit when `count + cost <= limit`; then `count += cost`. A denied request adds its cost
//!   only with `count_denied`, up to a count of `2 x limit`.
//! - `remaining = limit - count`; `reset` is the end of the window (when `count > 0`);
//!   `retry_after` of a denial is the end of the window, when the count starts again at zero.
//! - The key expires at the end of its window.
//!
//! Bound: at most `limit` per window, but up to `2 x limit` in an interval of one window's
//! length that straddles a boundary (`limit` at the end of one window, `limit` at the start of
//! the next).

use super::exact::{ceil_ms, ttl_ms};
use super::model::{Outcome, Request, Update};
use crate::limit::WindowLimit;
use crate::verdict::Verdict;

/// The stored counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// The window index, `floor(time / window)`.
    pub window: i64,
    /// Units counted in that window.
    pub count: u64,
}

/// Decides one request; see the module documentation.
pub fn decide(limit: &WindowLimit, state: Option<&State>, req: Request) -> Outcome<State> {
    let window_us = limit.window().as_micros();
    let cap = limit.limit();
    let (index, count) = match state {
        Some(s) if s.window >= req.now_us.div_euclid(window_us) => (s.window, s.count),
        _ => (req.now_us.div_euclid(window_us), 0),
    };
    let to_window_end = i128::from(index + 1) * i128::from(window_us) - i128::from(req.now_us);
    let reset_ms = |count: u64| if count > 0 { ceil_ms(to_window_end) } else { 0 };

    if req.cost > cap {
        return Outcome {
            verdict: Verdict::impossible(cap, cap.saturating_sub(count), reset_ms(count)),
            update: Update::Keep,
        };
    }
    let allowed = count + req.cost <= cap;
    let new_count = if allowed {
        count + req.cost
    } else if req.count_denied {
        count.max((count + req.cost).min(2 * cap))
    } else {
        count
    };
    let verdict = Verdict {
        allowed,
        limit: cap,
        remaining: cap.saturating_sub(new_count),
        reset_ms: reset_ms(new_count),
        retry_after_ms: Some(if allowed { 0 } else { ceil_ms(to_window_end) }),
        delay_ms: 0,
    };
    let update = if new_count == count {
        Update::Keep
    } else {
        Update::Write {
            state: State {
                window: index,
                count: new_count,
            },
            ttl_ms: ttl_ms(to_window_end),
        }
    };
    Outcome { verdict, update }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Limit;

    fn limit(json: &str) -> WindowLimit {
        match serde_json::from_str::<Limit>(json).unwrap() {
            Limit::FixedWindow(w) => w,
            other => panic!("not a fixed window: {other:?}"),
        }
    }

    fn run(l: &WindowLimit, times_ms: &[i64]) -> Vec<bool> {
        let mut state = None;
        times_ms
            .iter()
            .map(|t| {
                let out = decide(l, state.as_ref(), Request::one_at(t * 1000));
                if let Update::Write { state: s, .. } = out.update {
                    state = Some(s);
                }
                out.verdict.allowed
            })
            .collect()
    }

    #[test]
    fn admits_limit_per_window_and_twice_that_across_a_boundary() {
        let l = limit(r#"{"algorithm":"fixed_window","limit":3,"window":"1s"}"#);
        // Three at the end of window 0, three at the start of window 1: six within 2 ms.
        let got = run(&l, &[999, 999, 999, 999, 1000, 1000, 1000, 1001]);
        assert_eq!(got, [true, true, true, false, true, true, true, false]);
    }

    #[test]
    fn a_denial_says_when_the_window_ends() {
        let l = limit(r#"{"algorithm":"fixed_window","limit":1,"window":"1m"}"#);
        let first = decide(&l, None, Request::one_at(15_000_000));
        let Update::Write { state, ttl_ms } = first.update else {
            panic!("must write")
        };
        assert_eq!(ttl_ms, 45_000);
        let second = decide(&l, Some(&state), Request::one_at(15_000_000));
        assert_eq!(second.verdict.retry_after_ms, Some(45_000));
        assert_eq!(second.verdict.remaining, 0);
        assert_eq!(second.update, Update::Keep);
    }

    #[test]
    fn a_late_caller_counts_into_the_newest_window() {
        let l = limit(r#"{"algorithm":"fixed_window","limit":1,"window":"1s"}"#);
        let state = State {
            window: 5,
            count: 1,
        };
        let late = decide(&l, Some(&state), Request::one_at(4_500_000));
        assert!(
            !late.verdict.allowed,
            "a lagging clock must not reopen an old window"
        );
    }
}
