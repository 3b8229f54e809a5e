//! Virtual scheduling: the one computation behind [`super::gcra`], [`super::token_bucket`] and
//! [`super::leaky_bucket`].
//!
//! A bucket of `burst` units refilled (or drained) at `rate` per `per` is fully described by
//! one time, the *theoretical arrival time* (TAT): when the bucket will be full again (token
//! bucket), empty again (leaky bucket), or when the next request is due (GCRA). With
//! `interval = per / rate` and `tolerance = interval × burst`:
//!
//! - `excess = max(TAT − now, 0)`: how far the key runs ahead of its rate. An absent key has
//!   `TAT = now`. Tokens are `(tolerance − excess) / interval`; a leaky bucket's level is
//!   `excess / interval`.
//! - A request of `cost` fits when `excess + interval × cost ≤ tolerance`. Shaping (a leaky
//!   bucket with `max_wait`) also needs `excess ≤ max_wait`, and holds the request `excess`.
//! - An admitted request moves the TAT to `now + excess + interval × cost`. With
//!   `count_denied` a denial moves it too, to at most `now + 2 × tolerance` (never back).
//! - `remaining = floor((tolerance − kept) / interval)`, `reset = kept` (the time until the
//!   bucket is whole again, when the key expires), and a denial's `retry_after` is when
//!   `kept` will have fallen to what the same request needs: `tolerance − interval × cost`
//!   (and at most `max_wait` when shaping).
//!
//! A caller whose clock lags is decided at its own time against the stored TAT, so it sees a
//! larger excess than a caller on time: lagging clocks can only be denied more.
//!
//! The arithmetic is exact: times are counted in [`Ticks`], so every TAT is a whole number of
//! ticks, stored as whole microseconds plus the ticks left over.

use super::exact::Ticks;
use super::model::{Outcome, Request, Update};
use crate::duration::Millis;
use crate::limit::BucketLimit;
use crate::verdict::Verdict;

/// The theoretical arrival time: `us` microseconds since the epoch plus `frac` ticks
/// (`frac < ticks_per_us`, see [`Ticks`]).
///
/// Redis stores it as `<us>:<frac>`, or `<us>` when `frac` is 0. A stored `frac` is capped at
/// `ticks_per_us − 1`, so state written under another rate is off by less than a microsecond,
/// never by a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tat {
    /// Whole microseconds since the epoch.
    pub us: i64,
    /// Ticks past `us`.
    pub frac: u64,
}

impl Tat {
    fn ticks(&self, t: &Ticks) -> i128 {
        t.in_us(self.us) + i128::from(self.frac.min(t.per_us - 1))
    }
}

/// Decides one request; see the module documentation. `max_wait` is the shaping limit of a
/// leaky bucket, `None` for every other bucket.
pub(crate) fn decide(
    limit: &BucketLimit,
    max_wait: Option<Millis>,
    state: Option<&Tat>,
    req: Request,
) -> Outcome<Tat> {
    let t = Ticks::of(limit);
    let now = t.in_us(req.now_us);
    let excess = state.map_or(0, |s| (s.ticks(&t) - now).max(0));
    let tolerance = t.units(limit.burst());
    let remaining = |excess: i128| t.whole_units(tolerance - excess);

    if req.cost > limit.burst() {
        let verdict = Verdict::impossible(limit.burst(), remaining(excess), t.ceil_ms(excess));
        return Outcome {
            verdict,
            update: Update::Keep,
        };
    }
    let cost = t.units(req.cost);
    let new_excess = excess + cost;
    let fits = new_excess <= tolerance;
    // `due`: the most excess this request may find and still pass.
    let (allowed, due) = match max_wait {
        None => (fits, tolerance - cost),
        Some(max_wait) => {
            let max_wait = t.in_us(max_wait.as_micros());
            (fits && excess <= max_wait, (tolerance - cost).min(max_wait))
        }
    };
    let kept = if allowed {
        new_excess
    } else if req.count_denied {
        excess.max(new_excess.min(2 * tolerance))
    } else {
        excess
    };
    let verdict = Verdict {
        allowed,
        limit: limit.burst(),
        remaining: remaining(kept),
        reset_ms: t.ceil_ms(kept),
        retry_after_ms: Some(if allowed { 0 } else { t.ceil_ms(kept - due) }),
        delay_ms: if allowed && max_wait.is_some() {
            t.ceil_ms(excess)
        } else {
            0
        },
    };
    let update = if kept == excess {
        Update::Keep
    } else {
        let (us, frac) = t.split(now + kept);
        Update::Write {
            state: Tat { us, frac },
            ttl_ms: t.ceil_ms(kept).max(1),
        }
    };
    Outcome { verdict, update }
}
