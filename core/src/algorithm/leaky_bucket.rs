//! Leaky bucket: a level that drains at `rate` per `per` from a bucket of size `burst`.
//!
//! Semantics (the contract `lua/leaky_bucket.lua` meets, with a hash `{level, ts}`):
//! - An absent key is an empty bucket. On each call `level = max(0, level - elapsed * rate /
//!   per)` with `elapsed = max(0, now - ts)`, and `ts = max(ts, now)`.
//! - Meter: admit when `level + cost <= burst` (within [`AMOUNT_EPSILON`]); then
//!   `level += cost`. `retry_after` of a denial is when the level has drained to `burst - cost`.
//! - Shaping: the water already in the bucket is queued ahead of the request, so it must wait
//!   `level * per / rate` before it leaves; admit when it fits (`level + cost <= burst`) and
//!   that wait is at most `max_wait`, and answer the wait as `delay_ms` (the filter holds the
//!   request that long, so traffic leaves at a steady rate). Otherwise deny; `retry_after` is
//!   when both conditions will hold.
//! - With `count_denied` a denial adds its cost too, up to a level of `2 x burst`.
//! - `remaining = floor(burst - level)`; `reset` is when the bucket is empty (the key expires
//!   then: an absent key is an empty bucket).
//!
//! Bound: `burst + rate x T` admitted in any interval `T`; in shaping mode requests *leave* at
//! `rate`.

use super::{AMOUNT_EPSILON, Outcome, Request, Update, ceil_ms, floor_units, ttl_ms};
use crate::limit::{LeakMode, LeakyLimit};
use crate::verdict::Verdict;

/// The bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct State {
    /// Water in the bucket at `ts`, in cost units.
    pub level: f64,
    /// The time of the last drain, microseconds.
    pub ts: i64,
}

/// Decides one request; see the module documentation.
pub fn decide(limit: &LeakyLimit, state: Option<&State>, req: Request) -> Outcome<State> {
    let bucket = limit.bucket();
    let burst = bucket.burst() as f64;
    let rate = bucket.rate() as f64;
    let per = bucket.per().as_micros() as f64;
    let (level, ts) = state.map_or((0.0, req.now_us), |s| (s.level, s.ts));
    let elapsed = (req.now_us - ts).max(0) as f64;
    let level = (level - elapsed * rate / per).max(0.0);
    let ts = ts.max(req.now_us);
    let drain_time = |level: f64| level * per / rate;

    if req.cost > bucket.burst() {
        let verdict = Verdict::impossible(
            bucket.burst(),
            floor_units(burst - level),
            ceil_ms(drain_time(level)),
        );
        return Outcome {
            verdict,
            update: Update::Keep,
        };
    }
    let cost = req.cost as f64;
    let fits = level + cost <= burst + AMOUNT_EPSILON;
    let wait_us = drain_time(level);
    let (allowed, delay_us) = match limit.mode() {
        LeakMode::Meter => (fits, 0.0),
        LeakMode::Shaping { max_wait } => {
            let allowed = fits && wait_us <= max_wait.as_micros() as f64;
            (allowed, if allowed { wait_us } else { 0.0 })
        }
    };
    let new_level = if allowed {
        level + cost
    } else if req.count_denied {
        (level + cost).min(2.0 * burst)
    } else {
        level
    };
    let retry_after_us = if allowed {
        0.0
    } else {
        let target = match limit.mode() {
            LeakMode::Meter => burst - cost,
            LeakMode::Shaping { max_wait } => {
                (burst - cost).min(max_wait.as_micros() as f64 * rate / per)
            }
        };
        drain_time(new_level - target)
    };
    let verdict = Verdict {
        allowed,
        limit: bucket.burst(),
        remaining: floor_units(burst - new_level),
        reset_ms: ceil_ms(drain_time(new_level)),
        retry_after_ms: Some(ceil_ms(retry_after_us)),
        delay_ms: ceil_ms(delay_us),
    };
    let update = if req.cost == 0 || !(allowed || req.count_denied) {
        Update::Keep
    } else {
        Update::Write {
            state: State {
                level: new_level,
                ts,
            },
            ttl_ms: ttl_ms(drain_time(new_level)),
        }
    };
    Outcome { verdict, update }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Limit;

    fn leaky(extra: &str) -> LeakyLimit {
        let json =
            format!(r#"{{"algorithm":"leaky_bucket","rate":10,"per":"1s","burst":3{extra}}}"#);
        match serde_json::from_str::<Limit>(&json).unwrap() {
            Limit::LeakyBucket(l) => l,
            other => panic!("{other:?}"),
        }
    }

    fn step(l: &LeakyLimit, state: &mut Option<State>, ms: i64) -> Verdict {
        let out = decide(
            l,
            state.as_ref(),
            Request {
                now_us: ms * 1000,
                cost: 1,
                count_denied: false,
            },
        );
        if let Update::Write { state: s, .. } = out.update {
            *state = Some(s);
        }
        out.verdict
    }

    #[test]
    fn a_meter_admits_what_fits_and_denies_the_rest() {
        let l = leaky("");
        let mut s = None;
        let got: Vec<bool> = (0..4).map(|_| step(&l, &mut s, 0).allowed).collect();
        assert_eq!(got, [true, true, true, false]);
        assert_eq!(step(&l, &mut s, 0).retry_after_ms, Some(100));
        assert!(step(&l, &mut s, 100).allowed);
    }

    #[test]
    fn shaping_spaces_requests_at_the_rate_up_to_max_wait() {
        let l = leaky(r#","mode":"shaping","max_wait":"150ms""#);
        let mut s = None;
        let delays: Vec<Option<u64>> = (0..4)
            .map(|_| {
                let v = step(&l, &mut s, 0);
                v.allowed.then_some(v.delay_ms)
            })
            .collect();
        // 0, 100 ms, then a wait of 200 ms exceeds max_wait.
        assert_eq!(delays, [Some(0), Some(100), None, None]);
        let denied = step(&l, &mut s, 0);
        assert_eq!(
            denied.retry_after_ms,
            Some(50),
            "level 2 must drain to 1.5 (150 ms of queue)"
        );
    }
}
