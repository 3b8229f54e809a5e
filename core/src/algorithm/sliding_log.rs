//! Sliding log: every admitted request is an entry stamped with its time and weighted by its
//! cost; exact.
//!
//! Semantics (the contract `lua/sliding_log.lua` meets, with a sorted set per key):
//! - `now` is raised to the newest entry's time if it lags it.
//! - Entries at or before `now - window` are dropped; the units of the rest are counted, all of
//!   them, including entries stamped later than a caller's own clock. (Counting only the range
//!   up to the caller's `now` is the classic bug: callers with older clocks see fewer entries
//!   and get in.)
//! - Admit when `count + cost <= limit`; then add one entry of `cost` units at `now`. In Redis
//!   an entry is a member `<end>/<units>`, `end` the log's running total of units through it
//!   (16 digits, so that members of one microsecond sort in the order they came), so two
//!   requests in the same microsecond are two entries, and a request of any cost is one: what
//!   a call can make Redis store or scan does not grow with its cost.
//! - With `count_denied`, a denied request adds its entry too, and the log keeps only its
//!   newest `2 x limit` units (the oldest entry kept may keep part of its units), so memory
//!   stays bounded while an abuser stays out.
//! - `retry_after` of a denial is when enough of the oldest units have left the window for the
//!   same cost to fit; `reset` is when the newest entry leaves it. The key expires then.
//!
//! Bound: exactly `limit` in any interval of `window`.

use super::exact::{ceil_ms, ttl_ms};
use super::model::{Outcome, Request, Update};
use crate::limit::WindowLimit;
use crate::verdict::Verdict;

/// One admitted (or counted) request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Its time, in microseconds.
    pub at_us: i64,
    /// The log's running total of units through this entry; strictly increasing.
    pub end: u64,
    /// Its units (at least 1).
    pub units: u64,
}

impl Entry {
    /// The running total before this entry's units.
    fn start(&self) -> u64 {
        self.end - self.units
    }
}

/// The log: its entries, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct State {
    /// Entries in ascending time (and running total).
    pub entries: Vec<Entry>,
}

/// Decides one request; see the module documentation.
pub fn decide(limit: &WindowLimit, state: Option<&State>, req: Request) -> Outcome<State> {
    let window_us = limit.window().as_micros();
    let cap = limit.limit();
    let mut entries = state.map(|s| s.entries.clone()).unwrap_or_default();
    let last_end = entries.last().map_or(0, |e| e.end);
    let now = entries
        .last()
        .map_or(req.now_us, |newest| newest.at_us.max(req.now_us));
    let trimmed_from = entries.len();
    entries.retain(|e| e.at_us > now - window_us);
    let trimmed = entries.len() != trimmed_from;
    let base = entries.first().map_or(last_end, Entry::start);
    let count = last_end - base;
    let until_newest_leaves = |entries: &[Entry]| {
        entries
            .last()
            .map_or(0, |e| i128::from(e.at_us + window_us - now))
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
    let mut held = count;
    let mut dropped = 0;
    if req.cost > 0 && (allowed || req.count_denied) {
        entries.push(Entry {
            at_us: now,
            end: last_end + req.cost,
            units: req.cost,
        });
        changed = true;
        held += req.cost;
        if !allowed && held > 2 * cap {
            dropped = held - 2 * cap;
            held = 2 * cap;
            drop_oldest_units(&mut entries, base + dropped);
        }
    }
    let retry_after_ms = if allowed {
        0
    } else {
        // The entry holding the k-th oldest unit kept must leave for `cost` more to fit.
        let k = held + req.cost - cap;
        let entry = entries
            .iter()
            .find(|e| e.end >= base + dropped + k)
            .map_or(now, |e| e.at_us);
        ceil_ms(i128::from(entry + window_us - now))
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

/// Drops every unit up to running total `cut`: whole entries, and part of the one `cut` falls in.
fn drop_oldest_units(entries: &mut Vec<Entry>, cut: u64) {
    entries.retain(|e| e.end > cut);
    if let Some(oldest) = entries.first_mut()
        && oldest.start() < cut
    {
        oldest.units = oldest.end - cut;
    }
}

fn write_if(
    changed: bool,
    entries: Vec<Entry>,
    lifetime: impl Fn(&[Entry]) -> i128,
) -> Update<State> {
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
        let entries = state.unwrap().entries;
        assert_eq!(entries.iter().map(|e| e.units).sum::<u64>(), 10);
        assert_eq!(entries.len(), 10);
    }

    #[test]
    fn a_costly_request_is_one_entry_and_counts_its_units() {
        let l = log(100_000, "30d");
        let big = |now_us, count_denied| Request {
            now_us,
            cost: 100_000,
            count_denied,
        };
        let first = decide(&l, None, big(0, false));
        assert!(first.verdict.allowed);
        let mut state = None;
        apply(&mut state, &first);
        assert_eq!(state.as_ref().unwrap().entries.len(), 1);
        let second = decide(&l, state.as_ref(), Request::one_at(1_000));
        assert!(!second.verdict.allowed, "the 100,000 units fill the log");
        assert_eq!(second.verdict.remaining, 0);
        assert_eq!(second.update, Update::Keep);
    }

    #[test]
    fn counted_denials_keep_part_of_the_oldest_entry() {
        let l = log(4, "1m");
        let mut state = None;
        for (t, cost) in [(0, 3), (1, 1), (2, 3), (3, 3)] {
            let out = decide(
                &l,
                state.as_ref(),
                Request {
                    now_us: t,
                    cost,
                    count_denied: true,
                },
            );
            apply(&mut state, &out);
        }
        // 3 + 1 admitted, then 3 and 3 counted: 10 units, of which the newest 8 are kept.
        let kept: Vec<(i64, u64)> = state
            .unwrap()
            .entries
            .iter()
            .map(|e| (e.at_us, e.units))
            .collect();
        assert_eq!(kept, [(0, 1), (1, 1), (2, 3), (3, 3)]);
    }
}
