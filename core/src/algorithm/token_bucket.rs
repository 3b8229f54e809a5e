//! Token bucket: `burst` tokens, refilled lazily at `rate` per `per`; fractional tokens.
//!
//! Semantics (the contract `lua/token_bucket.lua` meets, with a string key holding one time):
//! - An absent key is a full bucket. A token bucket is kept as the time it will be full again
//!   (its theoretical arrival time, see [`super::schedule`]): `tokens = burst − (full_at −
//!   now) × rate / per`, never above `burst`. No timer; a caller whose clock lags sees the
//!   tokens of its own time, fewer than a caller on time.
//! - Admit when `tokens ≥ cost`; then `tokens −= cost`. With `count_denied` a denial takes its
//!   tokens too, down to a debt of at most `−burst`, so an abuser who keeps knocking stays
//!   out, and comes back at most `2 × burst / rate` after they stop.
//! - `remaining = floor(tokens)`; `reset` is when the bucket is full again (the key expires
//!   then: an absent key is a full bucket); `retry_after` of a denial is when `cost` tokens
//!   will be there.
//!
//! It makes the same decisions as [`super::gcra`] for the same parameters: both are the
//! virtual-scheduling form of one bucket, named in tokens here and in arrival times there.
//!
//! Bound: `burst + rate x T` in any interval `T`.

use super::model::{Outcome, Request};
use super::schedule;
use crate::limit::BucketLimit;

/// The time the bucket is full again.
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
    use crate::verdict::Verdict;

    fn bucket(rate: u64, per: &str, burst: u64) -> BucketLimit {
        let json = format!(
            r#"{{"algorithm":"token_bucket","rate":{rate},"per":"{per}","burst":{burst}}}"#
        );
        match serde_json::from_str::<Limit>(&json).unwrap() {
            Limit::TokenBucket(b) => b,
            other => panic!("{other:?}"),
        }
    }

    fn step(
        l: &BucketLimit,
        state: &mut Option<State>,
        ms: i64,
        cost: u64,
        count_denied: bool,
    ) -> Verdict {
        let out = decide(
            l,
            state.as_ref(),
            Request {
                now_us: ms * 1000,
                cost,
                count_denied,
            },
        );
        if let Update::Write { state: s, .. } = out.update {
            *state = Some(s);
        }
        out.verdict
    }

    #[test]
    fn bursts_then_refills_fractionally() {
        let l = bucket(2, "1s", 3);
        let mut s = None;
        let admitted: Vec<bool> = (0..4)
            .map(|_| step(&l, &mut s, 0, 1, false).allowed)
            .collect();
        assert_eq!(admitted, [true, true, true, false]);
        // 250 ms refill half a token: still no whole token; at 500 ms there is one.
        let v = step(&l, &mut s, 250, 1, false);
        assert!(!v.allowed);
        assert_eq!(v.retry_after_ms, Some(250));
        assert!(step(&l, &mut s, 500, 1, false).allowed);
    }

    #[test]
    fn counted_denials_are_a_bounded_debt() {
        let l = bucket(1, "1s", 2);
        let mut s = None;
        for _ in 0..50 {
            step(&l, &mut s, 0, 1, true);
        }
        // A debt of 2 tokens: full again 4 s from now.
        assert_eq!(
            s,
            Some(State {
                us: 4_000_000,
                frac: 0
            })
        );
        // 2 tokens of debt + 1 to pay: 3 s.
        assert_eq!(step(&l, &mut s, 0, 1, true).retry_after_ms, Some(3000));
    }

    #[test]
    fn a_lagging_clock_sees_the_tokens_of_its_own_time() {
        let l = bucket(1, "1s", 1);
        let mut s = None;
        assert!(step(&l, &mut s, 10_000, 1, false).allowed);
        assert!(!step(&l, &mut s, 9_000, 1, false).allowed);
    }
}
