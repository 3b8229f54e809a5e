//! What a rule allows: an algorithm and its parameters, validated once.
//!
//! The same JSON shape is written in the filter's configuration and sent on the wire, so a limit
//! that the filter accepted is a limit the server accepts:
//!
//! ```
//! use sluice_core::limit::Limit;
//! let limit: Limit = serde_json::from_str(
//!     r#"{"algorithm": "gcra", "rate": 10, "per": "1s", "burst": 20}"#,
//! ).unwrap();
//! assert_eq!(limit.capacity(), 20);
//!
//! let err = serde_json::from_str::<Limit>(r#"{"algorithm": "gcra", "rate": 10, "per": "1s"}"#)
//!     .unwrap_err();
//! assert!(err.to_string().contains("needs `burst`"), "{err}");
//! ```

mod raw;
#[cfg(test)]
mod tests;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::duration::Millis;

pub use self::raw::{LimitError, RawLimit};

/// The largest `limit`, `rate`, `burst` or `cost`: keeps every quantity exact in Lua's doubles.
pub const MAX_AMOUNT: u64 = 1_000_000_000;
/// The largest `limit` of a `sliding_log`, which stores one entry per admitted request: as
/// many entries as the limit (twice as many with denials counted) when each costs one unit.
pub const MAX_LOG_ENTRIES: u64 = 100_000;
/// The longest window, period or wait: 30 days.
pub const MAX_DURATION_MS: u64 = 30 * 86_400_000;
/// The longest a bucket may take to fill from empty (`burst × per / rate`): 3650 days. With
/// denials counted a bucket's arrival time runs up to two fills ahead, and every arrival time
/// must stay below 2^53 µs (the year 2255), where the scripts' doubles count exactly.
pub const MAX_FILL_MS: u64 = 3650 * 86_400_000;

/// The six algorithms, by the name used in configuration and on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// One counter per fixed window.
    FixedWindow,
    /// A log of admitted requests; exact.
    SlidingLog,
    /// Two counters weighted by position in the window (Cloudflare's estimate).
    SlidingWindow,
    /// Tokens refilled lazily at a steady rate.
    TokenBucket,
    /// A level that leaks at a steady rate; meters or shapes.
    LeakyBucket,
    /// The generic cell rate algorithm, as redis-cell's `CL.THROTTLE`.
    Gcra,
}

impl Algorithm {
    /// Every algorithm, in a fixed order.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::Gcra,
    ];

    /// The name written in configuration, on the wire and in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::Gcra => "gcra",
        }
    }

    /// The short code that ends its Redis keys ([`crate::key::redis_key`]). It names the
    /// algorithm and the layout of its stored value; a new layout gets a new code, so that a
    /// server never reads state another version wrote in another shape. (sluice 0.1 stored
    /// hashes under the algorithms' full names; the sliding log was `sl` while it kept a member
    /// per unit, and is `wl` since a member is a weighted request.)
    pub const fn storage_code(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fw",
            Algorithm::SlidingLog => "wl",
            Algorithm::SlidingWindow => "sw",
            Algorithm::TokenBucket => "tb",
            Algorithm::LeakyBucket => "lb",
            Algorithm::Gcra => "gc",
        }
    }

    /// Its position in [`Algorithm::ALL`].
    pub const fn ordinal(self) -> usize {
        match self {
            Algorithm::FixedWindow => 0,
            Algorithm::SlidingLog => 1,
            Algorithm::SlidingWindow => 2,
            Algorithm::TokenBucket => 3,
            Algorithm::LeakyBucket => 4,
            Algorithm::Gcra => 5,
        }
    }

    /// The algorithm called `name`, if any.
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `limit` requests in any window of `window` (by the algorithm's own definition of window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowLimit {
    limit: u64,
    window: Millis,
}

impl WindowLimit {
    /// The number of requests (cost units) a window admits.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// The window's length.
    pub fn window(&self) -> Millis {
        self.window
    }
}

/// `rate` units every `per`, with room for `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketLimit {
    rate: u64,
    per: Millis,
    burst: u64,
}

impl BucketLimit {
    /// Units restored every `per`.
    pub fn rate(&self) -> u64 {
        self.rate
    }
    /// The period `rate` is counted over.
    pub fn per(&self) -> Millis {
        self.per
    }
    /// The most units available at once (the bucket's size).
    pub fn burst(&self) -> u64 {
        self.burst
    }
    /// Milliseconds a bucket takes to fill from empty, `burst × per / rate`, rounded up.
    pub fn fill_ms(&self) -> u64 {
        // A bucket is only built from validated amounts (`burst` at most MAX_AMOUNT, `per` at
        // most MAX_DURATION_MS, `rate` at least 1), so the product fits in 64 bits, whose
        // division is one instruction in wasm (a 128-bit one is a library call the filter would
        // pay per request).
        self.burst
            .saturating_mul(self.per.as_millis())
            .div_ceil(self.rate)
    }
}

/// How a leaky bucket treats a request that does not fit at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeakMode {
    /// Police: admit what fits in the bucket now, deny the rest.
    Meter,
    /// Shape: admit what fits, but hold it until the water ahead of it has leaked, at most
    /// `max_wait`; deny what would wait longer.
    Shaping {
        /// The longest a request may be held.
        max_wait: Millis,
    },
}

impl LeakMode {
    /// The longest a request may be held: `Some` when shaping.
    pub fn max_wait(self) -> Option<Millis> {
        match self {
            LeakMode::Meter => None,
            LeakMode::Shaping { max_wait } => Some(max_wait),
        }
    }
}

/// A leaky bucket: a bucket limit and a mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeakyLimit {
    bucket: BucketLimit,
    mode: LeakMode,
}

impl LeakyLimit {
    /// Rate and size.
    pub fn bucket(&self) -> &BucketLimit {
        &self.bucket
    }
    /// Meter or shaping.
    pub fn mode(&self) -> LeakMode {
        self.mode
    }
}

/// A validated limit: an algorithm with parameters that are all in bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawLimit", into = "RawLimit")]
pub enum Limit {
    /// See [`crate::algorithm::fixed_window`].
    FixedWindow(WindowLimit),
    /// See [`crate::algorithm::sliding_log`].
    SlidingLog(WindowLimit),
    /// See [`crate::algorithm::sliding_window`].
    SlidingWindow(WindowLimit),
    /// See [`crate::algorithm::token_bucket`].
    TokenBucket(BucketLimit),
    /// See [`crate::algorithm::leaky_bucket`].
    LeakyBucket(LeakyLimit),
    /// See [`crate::algorithm::gcra`].
    Gcra(BucketLimit),
}

impl Limit {
    /// A fixed window of `window` that admits nothing (only a request of cost 0, which asks):
    /// the rate limit service's `requests_per_unit: 0`, which blocks a descriptor outright.
    /// Its denials are impossible ones (no wait admits them), in the models and the scripts
    /// alike. A policy cannot name it: a limit of 0 is refused there as a likely mistake.
    pub fn deny_all(window: Millis) -> Limit {
        let longest = Millis::new(MAX_DURATION_MS).unwrap_or(Millis::MIN);
        Limit::FixedWindow(WindowLimit {
            limit: 0,
            window: window.min(longest),
        })
    }

    /// Appends the parameters that give this limit's state its meaning, written into its Redis
    /// key (see [`crate::key::redis_key`]): `limit/window` in milliseconds for the windows,
    /// `rate/per/burst` for the buckets. A rule whose limit changes starts on state of its own
    /// instead of reading what the old limit wrote. Written with `itoa`, not `format!`: the
    /// server builds a key for every check, and `format!` was 3 % of its instructions.
    pub fn write_state_code(&self, out: &mut String) {
        let bucket = |b: &BucketLimit| [b.rate, b.per.as_millis(), b.burst];
        let window = |w: &WindowLimit| [w.limit, w.window.as_millis()];
        let mut digits = itoa::Buffer::new();
        let mut write = |numbers: &[u64]| {
            for (i, n) in numbers.iter().enumerate() {
                if i > 0 {
                    out.push('/');
                }
                out.push_str(digits.format(*n));
            }
        };
        match self {
            Limit::FixedWindow(w) | Limit::SlidingLog(w) | Limit::SlidingWindow(w) => {
                write(&window(w));
            }
            Limit::TokenBucket(b) | Limit::Gcra(b) => write(&bucket(b)),
            Limit::LeakyBucket(l) => write(&bucket(&l.bucket)),
        }
    }

    /// The algorithm this limit uses.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Limit::FixedWindow(_) => Algorithm::FixedWindow,
            Limit::SlidingLog(_) => Algorithm::SlidingLog,
            Limit::SlidingWindow(_) => Algorithm::SlidingWindow,
            Limit::TokenBucket(_) => Algorithm::TokenBucket,
            Limit::LeakyBucket(_) => Algorithm::LeakyBucket,
            Limit::Gcra(_) => Algorithm::Gcra,
        }
    }

    /// The most a single request may cost and still pass some day: the window's `limit` or the
    /// bucket's `burst`. This is the `limit` every answer reports.
    pub fn capacity(&self) -> u64 {
        match self {
            Limit::FixedWindow(w) | Limit::SlidingLog(w) | Limit::SlidingWindow(w) => w.limit,
            Limit::TokenBucket(b) | Limit::Gcra(b) => b.burst,
            Limit::LeakyBucket(l) => l.bucket.burst,
        }
    }

    /// The bucket of a bucket algorithm (token bucket, gcra, leaky bucket); `None` for a window.
    pub fn bucket_limit(&self) -> Option<&BucketLimit> {
        match self {
            Limit::TokenBucket(b) | Limit::Gcra(b) => Some(b),
            Limit::LeakyBucket(l) => Some(&l.bucket),
            Limit::FixedWindow(_) | Limit::SlidingLog(_) | Limit::SlidingWindow(_) => None,
        }
    }

    /// Whether it is a shaping leaky bucket: one that delays requests, not only admits or
    /// denies them.
    pub fn shapes(&self) -> bool {
        matches!(self, Limit::LeakyBucket(l) if matches!(l.mode(), LeakMode::Shaping { .. }))
    }

    /// The longest a shaping leaky bucket may hold a request; 0 for every other limit.
    pub fn max_wait_ms(&self) -> u64 {
        match self {
            Limit::LeakyBucket(l) => l.mode.max_wait().map_or(0, Millis::as_millis),
            _ => 0,
        }
    }

    /// The longest wait any answer of this limit reports (`reset_ms`, `retry_after_ms`) when
    /// its callers share one clock: two windows (a sliding window's previous count weighs for
    /// a window more) or two fills of the bucket (counted denials run it up to one burst into
    /// debt). A caller whose clock lags the key's latest time may be told more, by the lag.
    pub fn longest_wait_ms(&self) -> u64 {
        match self {
            Limit::FixedWindow(w) | Limit::SlidingLog(w) | Limit::SlidingWindow(w) => {
                w.window.as_millis().saturating_mul(2)
            }
            Limit::TokenBucket(b) | Limit::Gcra(b) => b.fill_ms().saturating_mul(2),
            Limit::LeakyBucket(l) => l.bucket.fill_ms().saturating_mul(2),
        }
    }

    /// The steady rate the limit stands for, as (units, period): `limit` per `window`, or
    /// `rate` per `per`. Reports measure accuracy against an exact limiter of this rate.
    pub fn nominal_rate(&self) -> (u64, Millis) {
        match self {
            Limit::FixedWindow(w) | Limit::SlidingLog(w) | Limit::SlidingWindow(w) => {
                (w.limit, w.window)
            }
            Limit::TokenBucket(b) | Limit::Gcra(b) => (b.rate, b.per),
            Limit::LeakyBucket(l) => (l.bucket.rate, l.bucket.per),
        }
    }

    /// The exact limiter of this limit's nominal rate: a sliding log of `units` per `period`,
    /// which never admits more than `units` in any interval of `period`. Reports hold every
    /// algorithm against it. `None` when the log would be too long to keep.
    pub fn exact(&self) -> Option<Limit> {
        let (units, period) = self.nominal_rate();
        Limit::try_from(RawLimit {
            algorithm: Algorithm::SlidingLog.name().to_owned(),
            limit: Some(units),
            window: Some(period),
            ..RawLimit::default()
        })
        .ok()
    }

    /// The most this limit can admit in any interval of `span_ms`, per the algorithm's bound
    /// (see `docs/algorithms.md`): 2 x limit across a fixed-window boundary, exactly the limit
    /// for the sliding log, burst + rate x T for the buckets and GCRA. The sliding window is an
    /// estimate; its bound here is the one of the fixed window it refines.
    pub fn admission_bound(&self, span_ms: u64) -> u64 {
        match self {
            Limit::SlidingLog(w) => w.limit * span_ms.div_ceil(w.window.as_millis()),
            Limit::FixedWindow(w) | Limit::SlidingWindow(w) => {
                w.limit * (span_ms.div_ceil(w.window.as_millis()) + 1)
            }
            Limit::TokenBucket(b) | Limit::Gcra(b) => bucket_bound(b, span_ms),
            Limit::LeakyBucket(l) => bucket_bound(&l.bucket, span_ms),
        }
    }
}

fn bucket_bound(b: &BucketLimit, span_ms: u64) -> u64 {
    let refilled = (b.rate as u128 * span_ms as u128) / b.per.as_millis() as u128;
    b.burst
        .saturating_add(u64::try_from(refilled).unwrap_or(u64::MAX))
}
