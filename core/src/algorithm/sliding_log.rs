//! Sliding log: every admitted unit is an entry stamped with its time; exact.
//!
//! Semantics (the contract `lua/sliding_log.lua` meets, with a sorted set per key):
//! - `now` is raised to the newest entry's time if it lags it.
//! - Entries at or before `now - window` are dropped; the rest are counted, all of them,
//!   including entries stamped later than a caller's own clock. (Counting only the range up to
//!   the caller's `now` is the classic bug: callers with older clocks see fewer entries and get
//!   in.)
//! - Admit when `count + cost <= limit`; then add `cost` entries at `now`. In Redis each entry
//!   is a member of its own (`<now>:<n>`, `n` one more than the largest already at that
//!   microsecond), so two requests in the same millisecond, or microsecond, are two entries.
//! - With `count_denied`, a denied request adds its entries too, and the log keeps only its
//!   newest `2 x limit` entries, so memory stays bounded while an abuser stays out.
//! - `retry_after` of a denial is when enough of the oldest entries have left the window for
//!   the same cost to fit; `reset` is when the newest entry leaves it. The key expires then.
//!
//! Bound: exactly `limit` in any interval of `window`.

use super::exact::{ceil_ms, ttl_ms};
use super::{Outcome, Request, Update};
use crate::limit::WindowLimit;
use crate::verdict::Verdict;

/// The log: entry times in microseconds, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    /// Entry times, ascending.
    pub entries: Vec<i64>,
}

/// Decides one request; see the module documentation.
pub fn decide(limit: &WindowLimit, state: Option<&State>, req: Request) -> Outcome<State> {
    let window_us = limit.window().as_micros();
    let cap = limit.limit();
    let mut entries = state.map(|s| s.entries.clone()).unwrap_or_default();
    let now = entries
        .last()
        .map_or(req.now_us, |&newest| newest.max(req.now_us));
    let trimmed_from = entries.len();
    entries.retain(|&t| t > now - window_us);
    let trimmed = entries.len() != trimmed_from;
    let count = entries.len() as u64;
    let until_newest_leaves = |entries: &[i64]| {
        entries
            .last()
            .map_or(0, |&t| i128::from(t + window_us - now))
    };

    if req.cost > cap {
        let verdict = Verdict::impossible(
            cap,
            cap.saturating_sub(count),
            ceil_ms(until_newest_leaves(&entries)),
        );
        return Outcome {
            verdict,
            update: write_if(trimmed, entries, until_newest_leaves),
        };
    }
    let allowed = count + req.cost <= cap;
    let mut changed = trimmed;
    if allowed || req.count_denied {
        entries.extend(std::iter::repeat_n(now, req.cost as usize));
        changed |= req.cost > 0;
        if !allowed {
            let keep = 2 * cap as usize;
            if entries.len() > keep {
                entries.drain(..entries.len() - keep);
            }
        }
    }
    let held = entries.len() as u64;
    let retry_after_ms = if allowed {
        0
    } else {
        // The k-th oldest entry must leave for `cost` more to fit; k <= held since cost <= cap.
        let k = (held + req.cost - cap) as usize;
        ceil_ms(i128::from(entries[k - 1] + window_us - now))
    };
    let verdict = Verdict {
        allowed,
        limit: cap,
        remaining: cap.saturating_sub(held),
        reset_ms: ceil_ms(until_newest_leaves(&entries)),
        retry_after_ms: Some(retry_after_ms),
        delay_ms: 0,
    };
    Outcome {
        verdict,
        update: write_if(changed, entries, until_newest_leaves),
    }
}

fn write_if(changed: bool, entries: Vec<i64>, lifetime: impl Fn(&[i64]) -> i128) -> Update<State> {
    if !changed {
        return Update::Keep;
    }
    // An emptied log is written as a deletion: the Lua script's trim leaves no key behind.
    let ttl_ms = ttl_ms(lifetime(&entries));
    Update::Write {
        state: State { entries },
        ttl_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Limit;

    fn log(limit: u64, window: &str) -> WindowLimit {
        let json = format!(r#"{{"algorithm":"sliding_log","limit":{limit},"window":"{window}"}}"#);
        match serde_json::from_str::<Limit>(&json).unwrap() {
            Limit::SlidingLog(w) => w,
            other => panic!("{other:?}"),
        }
    }

    fn apply(state: &mut Option<State>, out: &Outcome<State>) {
        if let Update::Write { state: s, .. } = &out.update {
            *state = Some(s.clone());
        }
    }

    #[test]
    fn never_admits_more_than_the_limit_in_any_window() {
        let l = log(3, "1s");
        let mut state = None;
        let mut admitted = Vec::new();
        for t_ms in [0, 100, 200, 300, 999, 1000, 1099, 1100, 1150, 1200, 2100] {
            let out = decide(&l, state.as_ref(), Request::one_at(t_ms * 1000));
            apply(&mut state, &out);
            if out.verdict.allowed {
                admitted.push(t_ms);
            }
        }
        assert_eq!(admitted, [0, 100, 200, 1000, 1100, 1200, 2100]);
    }

    #[test]
    fn callers_with_older_clocks_see_every_entry() {
        let l = log(10, "1s");
        let mut state = None;
        let mut allowed = 0;
        // Concurrent callers whose clocks are spread over 900 ms, arriving newest first.
        for i in (0..20).rev() {
            let out = decide(&l, state.as_ref(), Request::one_at(i * 45_000));
            apply(&mut state, &out);
            allowed += u64::from(out.verdict.allowed);
        }
        assert_eq!(allowed, 10);
    }

    #[test]
    fn retry_after_points_at_the_entry_that_must_leave() {
        let l = log(2, "1s");
        let mut state = None;
        for t_ms in [0, 400] {
            let out = decide(&l, state.as_ref(), Request::one_at(t_ms * 1000));
            apply(&mut state, &out);
        }
        let denied = decide(
            &l,
            state.as_ref(),
            Request {
                now_us: 500_000,
                cost: 2,
                count_denied: false,
            },
        );
        assert_eq!(
            denied.verdict.retry_after_ms,
            Some(900),
            "both entries must leave: the one at 400 ms does at 1400 ms"
        );
        assert_eq!(denied.verdict.reset_ms, 900);
    }

    #[test]
    fn counted_denials_keep_at_most_twice_the_limit() {
        let l = log(5, "1m");
        let mut state = None;
        for i in 0..100 {
            let out = decide(
                &l,
                state.as_ref(),
                Request {
                    now_us: i * 1000,
                    cost: 1,
                    count_denied: true,
                },
            );
            apply(&mut state, &out);
        }
        assert_eq!(state.unwrap().entries.len(), 10);
    }
}
