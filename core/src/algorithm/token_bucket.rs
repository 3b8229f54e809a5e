//! Token bucket: `burst` tokens, refilled lazily at `rate` per `per`; fractional tokens.
//!
//! Semantics (the contract `lua/token_bucket.lua` meets, with a hash `{tokens, ts}`):
//! - An absent key is a full bucket. On each call `tokens = min(burst, tokens + elapsed * rate
//!   / per)` with `elapsed = max(0, now - ts)`, and `ts = max(ts, now)`: no timer, and a caller
//!   whose clock lags gets no refill.
//! - Admit when `tokens >= cost` (within [`AMOUNT_EPSILON`]); then `tokens -= cost`. With
//!   `count_denied` a denial takes its tokens too, down to a debt of at most `-burst`, so an
//!   abuser who keeps knocking stays out, and comes back at most `2 x burst / rate` after they
//!   stop.
//! - `remaining = floor(tokens)`; `reset` is when the bucket is full again (the key expires
//!   then: an absent key is a full bucket); `retry_after` of a denial is when `cost` tokens
//!   will be there.
//!
//! Bound: `burst + rate x T` in any interval `T`.

use super::{AMOUNT_EPSILON, Outcome, Request, Update, ceil_ms, floor_units, ttl_ms};
use crate::limit::BucketLimit;
use crate::verdict::Verdict;

/// The bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct State {
    /// Tokens at `ts`; may be fractional, and negative with `count_denied`.
    pub tokens: f64,
    /// The time of the last refill, microseconds.
    pub ts: i64,
}

/// Decides one request; see the module documentation.
pub fn decide(limit: &BucketLimit, state: Option<&State>, req: Request) -> Outcome<State> {
    let burst = limit.burst() as f64;
    let rate = limit.rate() as f64;
    let per = limit.per().as_micros() as f64;
    let (tokens, ts) = state.map_or((burst, req.now_us), |s| (s.tokens, s.ts));
    let elapsed = (req.now_us - ts).max(0) as f64;
    let tokens = burst.min(tokens + elapsed * rate / per);
    let ts = ts.max(req.now_us);
    let until_full = |tokens: f64| (burst - tokens) * per / rate;

    if req.cost > limit.burst() {
        let verdict = Verdict::impossible(
            limit.burst(),
            floor_units(tokens),
            ceil_ms(until_full(tokens)),
        );
        return Outcome {
            verdict,
            update: Update::Keep,
        };
    }
    let cost = req.cost as f64;
    let allowed = tokens + AMOUNT_EPSILON >= cost;
    let new_tokens = if allowed {
        tokens - cost
    } else if req.count_denied {
        (tokens - cost).max(-burst)
    } else {
        tokens
    };
    let retry_after_us = if allowed {
        0.0
    } else {
        (cost - new_tokens) * per / rate
    };
    let verdict = Verdict {
        allowed,
        limit: limit.burst(),
        remaining: floor_units(new_tokens),
        reset_ms: ceil_ms(until_full(new_tokens)),
        retry_after_ms: Some(ceil_ms(retry_after_us)),
        delay_ms: 0,
    };
    let update = if req.cost == 0 || !(allowed || req.count_denied) {
        Update::Keep
    } else {
        Update::Write {
            state: State {
                tokens: new_tokens,
                ts,
            },
            ttl_ms: ttl_ms(until_full(new_tokens)),
        }
    };
    Outcome { verdict, update }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Limit;

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
        assert_eq!(s.unwrap().tokens, -2.0);
        // 2 tokens of debt + 1 to pay: 3 s.
        assert_eq!(step(&l, &mut s, 0, 1, true).retry_after_ms, Some(3000));
    }

    #[test]
    fn a_lagging_clock_gets_no_refill() {
        let l = bucket(1, "1s", 1);
        let mut s = None;
        assert!(step(&l, &mut s, 10_000, 1, false).allowed);
        assert!(!step(&l, &mut s, 9_000, 1, false).allowed);
    }
}
