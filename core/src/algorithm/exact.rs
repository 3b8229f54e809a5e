//! Exact integer arithmetic for the models.
//!
//! Every answer (`remaining`, `reset_ms`, `retry_after_ms`, `delay_ms`) is a floor or a ceiling
//! of a rational number. Computed in floating point at real epoch times (about 1.7e15 µs, where
//! a double keeps a quarter of a microsecond), a value that is exactly a whole number can land
//! just below it and be floored one unit short. So the models compute in integers: times
//! relative to `now` wherever a floor or a ceiling is taken, fractions of a microsecond as
//! numerators over a known denominator, products in `i128`. The Lua scripts reach the same
//! integers with doubles that never leave the range where doubles are exact, and an exact
//! `muldivmod` (see `lua/prelude.lua`) where a product could.

use crate::limit::BucketLimit;

/// Microseconds to whole milliseconds, rounded up (a client told to wait must not come back
/// early); 0 for a time that is not in the future.
pub fn ceil_ms(us: i128) -> u64 {
    ceil_div_nonneg(us, 1000)
}

/// `ceil(n / d)` for `d > 0`, or 0 when `n <= 0`; saturating at `u64::MAX`.
pub(crate) fn ceil_div_nonneg(n: i128, d: i128) -> u64 {
    if n <= 0 {
        return 0;
    }
    u64::try_from((n + d - 1) / d).unwrap_or(u64::MAX)
}

/// `floor(n / d)` for `d > 0`, or 0 when `n <= 0`; saturating at `u64::MAX`.
pub(crate) fn floor_div_nonneg(n: i128, d: i128) -> u64 {
    if n <= 0 {
        return 0;
    }
    u64::try_from(n / d).unwrap_or(u64::MAX)
}

/// A key's time to live in milliseconds: [`ceil_ms`], at least 1.
pub(crate) fn ttl_ms(us: i128) -> u64 {
    ceil_ms(us).max(1)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The time scale of a bucket limit: one unit every `per / rate` µs, which is a whole number of
/// *ticks* of `1 / ticks_per_us` µs. With `g = gcd(per_us, rate)`: `ticks_per_unit = per_us /
/// g` and `ticks_per_us = rate / g`, the smallest integers for which every arrival time the
/// bucket algorithms compute is a whole number of ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticks {
    /// Ticks in one unit's interval (`per / rate`).
    pub per_unit: u64,
    /// Ticks in one microsecond.
    pub per_us: u64,
}

impl Ticks {
    /// The scale of `limit`.
    pub fn of(limit: &BucketLimit) -> Ticks {
        let per_us = limit.per().as_micros().unsigned_abs();
        let g = gcd(per_us, limit.rate());
        Ticks {
            per_unit: per_us / g,
            per_us: limit.rate() / g,
        }
    }

    /// `us` microseconds, in ticks.
    pub(crate) fn in_us(&self, us: i64) -> i128 {
        i128::from(us) * i128::from(self.per_us)
    }

    /// Ticks in `units` intervals.
    pub(crate) fn units(&self, units: u64) -> i128 {
        i128::from(units) * i128::from(self.per_unit)
    }

    /// Whole units in `ticks` (floored, 0 if negative).
    pub(crate) fn whole_units(&self, ticks: i128) -> u64 {
        floor_div_nonneg(ticks, i128::from(self.per_unit))
    }

    /// `ticks` as milliseconds rounded up (0 if not positive).
    pub(crate) fn ceil_ms(&self, ticks: i128) -> u64 {
        ceil_div_nonneg(ticks, i128::from(self.per_us) * 1000)
    }

    /// A time in ticks as whole microseconds (floored) and the ticks left over.
    pub(crate) fn split(&self, ticks: i128) -> (i64, u64) {
        let per_us = i128::from(self.per_us);
        let us = ticks.div_euclid(per_us);
        let frac = ticks.rem_euclid(per_us);
        (
            i64::try_from(us).unwrap_or(i64::MAX),
            u64::try_from(frac).unwrap_or(0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Limit;

    fn bucket(json: &str) -> BucketLimit {
        match serde_json::from_str::<Limit>(json).unwrap() {
            Limit::Gcra(b) | Limit::TokenBucket(b) => b,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ticks_are_the_smallest_whole_scale() {
        let t = Ticks::of(&bucket(
            r#"{"algorithm":"gcra","rate":49,"per":"1s","burst":4}"#,
        ));
        assert_eq!(
            t,
            Ticks {
                per_unit: 1_000_000,
                per_us: 49
            }
        );
        let t = Ticks::of(&bucket(
            r#"{"algorithm":"gcra","rate":1000000,"per":"1d","burst":4}"#,
        ));
        assert_eq!(
            t,
            Ticks {
                per_unit: 86_400,
                per_us: 1
            }
        );
        assert_eq!(t.split(t.in_us(-3)), (-3, 0));
    }

    #[test]
    fn rounding_is_exact_at_every_magnitude() {
        assert_eq!(ceil_ms(1_700_000_000_000_001), 1_700_000_000_001);
        assert_eq!(ceil_ms(1_700_000_000_000_000), 1_700_000_000_000);
        assert_eq!(ceil_ms(0), 0);
        assert_eq!(ceil_ms(-5), 0);
        assert_eq!(ttl_ms(0), 1);
        let t = Ticks {
            per_unit: 3,
            per_us: 7,
        };
        // 7001 ticks = 1000.14 us -> 2 ms; 7000 ticks = exactly 1 ms.
        assert_eq!(t.ceil_ms(7001), 2);
        assert_eq!(t.ceil_ms(7000), 1);
        let (us, frac) = t.split(1_700_000_000_000_000 * 7 + 5);
        assert_eq!((us, frac), (1_700_000_000_000_000, 5));
    }
}
