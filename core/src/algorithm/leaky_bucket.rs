//! Leaky bucket: a level that drains at `rate` per `per` from a bucket of size `burst`.
//!
//! Semantics (the contract `lua/leaky_bucket.lua` meets, with a string key holding one time):
//! - An absent key is an empty bucket. The bucket is kept as the time it will be empty (its
//!   theoretical arrival time, see [`super::schedule`]): `level = (empty_at − now) × rate /
//!   per`, never below 0. A caller whose clock lags sees the level of its own time, higher
//!   than a caller on time sees.
//! - Meter: admit when `level + cost <= burst`; then `level += cost`. `retry_after` of a
//!   denial is when the level has drained to `burst - cost`.
//! - Shaping: the water already in the bucket is queued ahead of the request, so it must wait
//!   `level * per / rate` before it leaves; admit when it fits (`level + cost <= burst`) and
//!   that wait is at most `max_wait`, and answer the wait as `delay_ms` (the filter holds the
//!   request that long, so traffic leaves at a steady rate). Otherwise deny; `retry_after` is
//!   when both conditions will hold.
//! - With `count_denied` a denial adds its cost too, up to a level of `2 x burst`.
//! - `remaining = floor(burst - level)`; `reset` is when the bucket is empty (the key expires
//!   then: an absent key is an empty bucket).
//!
//! As a meter it makes the same decisions as [`super::token_bucket`] and [`super::gcra`].
//!
//! Bound: `burst + rate x T` admitted in any interval `T`; in shaping mode requests *leave* at
//! `rate`.

use super::model::{Outcome, Request};
use super::schedule;
use crate::limit::LeakyLimit;

/// The time the bucket is empty.
pub type State = schedule::Tat;

/// Decides one request; see the module documentation.
pub fn decide(limit: &LeakyLimit, state: Option<&State>, req: Request) -> Outcome<State> {
    schedule::decide(limit.bucket(), limit.mode().max_wait(), state, req)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Update;
    use crate::limit::Limit;
    use crate::verdict::Verdict;

    fn leaky(extra: &str) -> LeakyLimit {
        let json =
            format!(r#"{{"algorithm":"leaky_bucket","rate":10,"per":"1s","burst":3{extra}}}"#);
        match serde_json::from_str::<Limit>(&json).unwrap() {
            Limit::LeakyBucket(l) => l,
            other => panic!("{other:?}"),
        }
    }

    fn step(l: &LeakyLimit, state: &mut Option<State>, ms: i64) -> Verdict {
        let out = decide(l, state.as_ref(), Request::one_at(ms * 1000));
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
