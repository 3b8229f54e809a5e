//! An Envoy's share of a limit as the token bucket its `rate_limit_quota` filter enforces.
//!
//! Envoy 1.40 refills an assigned token bucket in whole seconds: a `fill_interval` of 0.5 s is
//! not enforced at all, one of 1 s is (`scripts/rlqs-probe.py` showed it). So a share of, say,
//! 1.5 requests a second is assigned as 3 tokens every 2 s, and one of 0.2 as 1 token every 5 s.
//! The bucket never refills faster than the share: what every Envoy's bucket admits together
//! stays within the sum of their shares.

/// The longest refill interval assigned: a share slower than one request in this many seconds
/// gets no refill at all.
pub const MAX_FILL_INTERVAL_S: u32 = 60;

/// A token bucket as Envoy's filter enforces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvoyTokenBucket {
    /// The most tokens it holds: the requests it admits at once.
    pub max_tokens: u32,
    /// Tokens added every `fill_interval_s`.
    pub tokens_per_fill: u32,
    /// Whole seconds between refills.
    pub fill_interval_s: u32,
}

impl EnvoyTokenBucket {
    /// The bucket refilling at most `rate_per_s` tokens a second, as close to it as whole-second
    /// intervals of up to ten seconds allow (the shortest of the closest), holding `burst`, or
    /// one refill if that is more: a bucket smaller than its refill would cap the rate at its
    /// size. `None` when the rate is below one token in
    /// [`MAX_FILL_INTERVAL_S`] or not a number: the share is too small to refill.
    pub fn at_most(rate_per_s: f64, burst: u32) -> Option<EnvoyTokenBucket> {
        if !(rate_per_s.is_finite() && rate_per_s > 0.0) {
            return None;
        }
        let fill = |interval: u32| {
            let tokens = (rate_per_s * f64::from(interval)).floor();
            // Rates beyond u32 tokens a second are clamped: Envoy takes a uint32.
            (tokens.min(f64::from(u32::MAX)) as u32, interval)
        };
        let (tokens_per_fill, fill_interval_s) = (1..=10)
            .map(fill)
            .filter(|&(tokens, _)| tokens > 0)
            // The closest to the rate; on a tie the shorter interval (`max_by` keeps the last).
            .max_by(|a, b| {
                let rate = |(tokens, interval): (u32, u32)| f64::from(tokens) / f64::from(interval);
                rate(*a).total_cmp(&rate(*b)).then(b.1.cmp(&a.1))
            })
            .or_else(|| {
                // Under a token in ten seconds: one token as often as the rate allows.
                let interval = (1.0 / rate_per_s).ceil();
                (interval <= f64::from(MAX_FILL_INTERVAL_S)).then_some((1, interval as u32))
            })?;
        Some(EnvoyTokenBucket {
            max_tokens: burst.max(tokens_per_fill),
            tokens_per_fill,
            fill_interval_s,
        })
    }

    /// The bucket refilling at most `rate_per_s`, as [`EnvoyTokenBucket::at_most`] picks its
    /// refill, but holding `max_tokens` (at least one), however many a refill adds: Envoy 1.40
    /// refills its buckets continuously, `tokens_per_fill / fill_interval` a second
    /// (`scripts/rlqs-probe.py`: 29 tokens every 5 s holding 6 admitted 5 or 6 each second,
    /// 29 every 5 s). `None` as for `at_most`.
    pub fn at_most_holding(rate_per_s: f64, max_tokens: u32) -> Option<EnvoyTokenBucket> {
        let bucket = EnvoyTokenBucket::at_most(rate_per_s, 0)?;
        Some(EnvoyTokenBucket {
            max_tokens: max_tokens.max(1),
            ..bucket
        })
    }

    /// The tokens it adds a second, on average.
    pub fn rate_per_s(&self) -> f64 {
        f64::from(self.tokens_per_fill) / f64::from(self.fill_interval_s)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn bucket(rate: f64, burst: u32) -> (u32, u32, u32) {
        let b = EnvoyTokenBucket::at_most(rate, burst).unwrap();
        (b.max_tokens, b.tokens_per_fill, b.fill_interval_s)
    }

    #[test]
    fn a_share_is_refilled_in_whole_seconds_as_close_to_its_rate_as_they_allow() {
        assert_eq!(bucket(100.0, 150), (150, 100, 1));
        // A bucket smaller than a refill would cap the rate at its size.
        assert_eq!(bucket(100.0, 50), (100, 100, 1));
        assert_eq!(bucket(1.5, 5), (5, 3, 2));
        assert_eq!(bucket(0.2, 3), (3, 1, 5));
        assert_eq!(bucket(2.7, 1), (27, 27, 10), "at least one refill's worth");
        assert_eq!(bucket(0.05, 1), (1, 1, 20));
        assert_eq!(
            EnvoyTokenBucket::at_most(0.01, 1),
            None,
            "slower than 1 in 60 s"
        );
        assert_eq!(EnvoyTokenBucket::at_most(0.0, 1), None);
        assert_eq!(EnvoyTokenBucket::at_most(f64::NAN, 1), None);
    }

    proptest! {
        #[test]
        fn a_bucket_never_refills_faster_than_its_share_and_loses_little_of_it(
            rate in 1.0f64..1e6,
            burst in 0u32..1_000_000,
        ) {
            let b = EnvoyTokenBucket::at_most(rate, burst).unwrap();
            prop_assert!(b.rate_per_s() <= rate);
            // With intervals of up to ten seconds, at most a tenth of a token a second is lost.
            prop_assert!(rate - b.rate_per_s() <= 0.1 + 1e-9, "{rate} -> {b:?}");
            prop_assert!(b.max_tokens >= burst && b.max_tokens >= b.tokens_per_fill);
        }

        #[test]
        fn a_slow_share_gets_one_token_as_often_as_it_allows(rate in 1.0f64 / 60.0..1.0) {
            let b = EnvoyTokenBucket::at_most(rate, 1).unwrap();
            prop_assert!(b.rate_per_s() <= rate);
            prop_assert!(b.fill_interval_s <= MAX_FILL_INTERVAL_S);
        }
    }
}
