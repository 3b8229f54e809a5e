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

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::duration::Millis;

/// The largest `limit`, `rate`, `burst` or `cost`: keeps every quantity exact in Lua's doubles.
pub const MAX_AMOUNT: u64 = 1_000_000_000;
/// The largest `limit` of a `sliding_log`, which stores one entry per admitted request.
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
    /// hashes under the algorithms' full names.)
    pub const fn storage_code(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fw",
            Algorithm::SlidingLog => "sl",
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

/// A limit exactly as written, before validation.
// The fields' order is the wire's: serde writes them so, and `wire::compact` reads them so.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RawLimit {
    /// One of the six algorithm names.
    #[cfg_attr(feature = "schema", schemars(extend("enum" = ["fixed_window", "sliding_log", "sliding_window", "token_bucket", "leaky_bucket", "gcra"])))]
    pub algorithm: String,
    /// Window algorithms: units per window (sliding_log: at most 100000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 1_000_000_000)))]
    pub limit: Option<u64>,
    /// Window algorithms: the window's length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<Millis>,
    /// Bucket algorithms: units restored every `per`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 1_000_000_000)))]
    pub rate: Option<u64>,
    /// Bucket algorithms: the period of `rate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per: Option<Millis>,
    /// Bucket algorithms: the bucket's size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 1_000_000_000)))]
    pub burst: Option<u64>,
    /// `leaky_bucket`: `meter` (default) or `shaping`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("enum" = ["meter", "shaping", null])))]
    pub mode: Option<String>,
    /// `leaky_bucket` in `shaping` mode: the longest a request may be held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<Millis>,
}

/// Why a limit was refused; each message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// `algorithm` is not one of the six.
    #[error(
        "unknown algorithm `{0}`: expected one of fixed_window, sliding_log, sliding_window, token_bucket, leaky_bucket, gcra"
    )]
    UnknownAlgorithm(String),
    /// A parameter the algorithm needs is absent.
    #[error("algorithm `{algorithm}` needs `{field}`")]
    Missing {
        /// The algorithm.
        algorithm: Algorithm,
        /// The absent field.
        field: &'static str,
    },
    /// A parameter that means nothing to the algorithm was given.
    #[error("`{field}` does not apply to algorithm `{algorithm}`")]
    NotApplicable {
        /// The algorithm.
        algorithm: Algorithm,
        /// The stray field.
        field: &'static str,
    },
    /// A number out of its bounds.
    #[error("`{field}` must be between 1 and {max}, not {value}")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// What was given.
        value: u64,
        /// The largest accepted.
        max: u64,
    },
    /// A duration longer than 30 days.
    #[error("`{field}` must be at most 30d, not {value}")]
    TooLong {
        /// The field.
        field: &'static str,
        /// What was given.
        value: Millis,
    },
    /// A bucket that would take longer than [`MAX_FILL_MS`] to fill.
    #[error(
        "`burst` x `per` / `rate` (the time the bucket takes to fill) must be at most 3650d, not {fill_days} days"
    )]
    FillTooLong {
        /// `burst × per / rate` in whole days, rounded up.
        fill_days: u64,
    },
    /// `mode` is neither `meter` nor `shaping`.
    #[error("`mode` must be `meter` or `shaping`, not `{0}`")]
    UnknownMode(String),
}

fn amount(field: &'static str, value: u64, max: u64) -> Result<u64, LimitError> {
    if (1..=max).contains(&value) {
        Ok(value)
    } else {
        Err(LimitError::OutOfRange { field, value, max })
    }
}

fn duration(field: &'static str, value: Millis) -> Result<Millis, LimitError> {
    if value.as_millis() <= MAX_DURATION_MS {
        Ok(value)
    } else {
        Err(LimitError::TooLong { field, value })
    }
}

impl TryFrom<RawLimit> for Limit {
    type Error = LimitError;

    fn try_from(raw: RawLimit) -> Result<Limit, LimitError> {
        let algorithm = Algorithm::from_name(&raw.algorithm)
            .ok_or_else(|| LimitError::UnknownAlgorithm(raw.algorithm.clone()))?;
        let need = |field: &'static str, present: bool| {
            if present {
                Ok(())
            } else {
                Err(LimitError::Missing { algorithm, field })
            }
        };
        let refuse = |field: &'static str, present: bool| {
            if present {
                Err(LimitError::NotApplicable { algorithm, field })
            } else {
                Ok(())
            }
        };
        let is_window = matches!(
            algorithm,
            Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow
        );
        if is_window {
            refuse("rate", raw.rate.is_some())?;
            refuse("per", raw.per.is_some())?;
            refuse("burst", raw.burst.is_some())?;
            need("limit", raw.limit.is_some())?;
            need("window", raw.window.is_some())?;
        } else {
            refuse("limit", raw.limit.is_some())?;
            refuse("window", raw.window.is_some())?;
            need("rate", raw.rate.is_some())?;
            need("per", raw.per.is_some())?;
            need("burst", raw.burst.is_some())?;
        }
        if algorithm != Algorithm::LeakyBucket {
            refuse("mode", raw.mode.is_some())?;
            refuse("max_wait", raw.max_wait.is_some())?;
        }
        let window = |max: u64| -> Result<WindowLimit, LimitError> {
            Ok(WindowLimit {
                limit: amount("limit", raw.limit.unwrap_or_default(), max)?,
                window: duration("window", raw.window.unwrap_or(Millis::MIN))?,
            })
        };
        let bucket = || -> Result<BucketLimit, LimitError> {
            let bucket = BucketLimit {
                rate: amount("rate", raw.rate.unwrap_or_default(), MAX_AMOUNT)?,
                per: duration("per", raw.per.unwrap_or(Millis::MIN))?,
                burst: amount("burst", raw.burst.unwrap_or_default(), MAX_AMOUNT)?,
            };
            if bucket.fill_ms() > MAX_FILL_MS {
                return Err(LimitError::FillTooLong {
                    fill_days: bucket.fill_ms().div_ceil(86_400_000),
                });
            }
            Ok(bucket)
        };
        Ok(match algorithm {
            Algorithm::FixedWindow => Limit::FixedWindow(window(MAX_AMOUNT)?),
            Algorithm::SlidingLog => Limit::SlidingLog(window(MAX_LOG_ENTRIES)?),
            Algorithm::SlidingWindow => Limit::SlidingWindow(window(MAX_AMOUNT)?),
            Algorithm::TokenBucket => Limit::TokenBucket(bucket()?),
            Algorithm::Gcra => Limit::Gcra(bucket()?),
            Algorithm::LeakyBucket => {
                let mode = match (raw.mode.as_deref(), raw.max_wait) {
                    (None | Some("meter"), None) => LeakMode::Meter,
                    (None | Some("meter"), Some(_)) => {
                        return Err(LimitError::NotApplicable {
                            algorithm,
                            field: "max_wait",
                        });
                    }
                    (Some("shaping"), Some(max_wait)) => LeakMode::Shaping {
                        max_wait: duration("max_wait", max_wait)?,
                    },
                    (Some("shaping"), None) => {
                        return Err(LimitError::Missing {
                            algorithm,
                            field: "max_wait",
                        });
                    }
                    (Some(other), _) => return Err(LimitError::UnknownMode(other.to_owned())),
                };
                Limit::LeakyBucket(LeakyLimit {
                    bucket: bucket()?,
                    mode,
                })
            }
        })
    }
}

impl From<Limit> for RawLimit {
    fn from(limit: Limit) -> RawLimit {
        let mut raw = RawLimit {
            algorithm: limit.algorithm().name().to_owned(),
            ..RawLimit::default()
        };
        let bucket = |b: BucketLimit, raw: &mut RawLimit| {
            raw.rate = Some(b.rate);
            raw.per = Some(b.per);
            raw.burst = Some(b.burst);
        };
        match limit {
            Limit::FixedWindow(w) | Limit::SlidingLog(w) | Limit::SlidingWindow(w) => {
                raw.limit = Some(w.limit);
                raw.window = Some(w.window);
            }
            Limit::TokenBucket(b) | Limit::Gcra(b) => bucket(b, &mut raw),
            Limit::LeakyBucket(l) => {
                bucket(l.bucket, &mut raw);
                if let LeakMode::Shaping { max_wait } = l.mode {
                    raw.mode = Some("shaping".to_owned());
                    raw.max_wait = Some(max_wait);
                }
            }
        }
        raw
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Limit {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Limit".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        RawLimit::json_schema(generator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Limit, String> {
        serde_json::from_str::<Limit>(json).map_err(|e| e.to_string())
    }

    #[test]
    fn every_algorithm_round_trips_through_json() {
        for json in [
            r#"{"algorithm":"fixed_window","limit":10,"window":"1s"}"#,
            r#"{"algorithm":"sliding_log","limit":10,"window":"1m"}"#,
            r#"{"algorithm":"sliding_window","limit":10,"window":"1h"}"#,
            r#"{"algorithm":"token_bucket","rate":5,"per":"1s","burst":10}"#,
            r#"{"algorithm":"leaky_bucket","rate":5,"per":"1s","burst":10}"#,
            r#"{"algorithm":"leaky_bucket","rate":5,"per":"1s","burst":10,"mode":"shaping","max_wait":"2s"}"#,
            r#"{"algorithm":"gcra","rate":5,"per":"1d","burst":10}"#,
        ] {
            let limit = parse(json).unwrap();
            assert_eq!(serde_json::to_string(&limit).unwrap(), json);
        }
    }

    #[test]
    fn errors_name_the_field_and_the_reason() {
        let cases = [
            (
                r#"{"algorithm":"nope","limit":1,"window":"1s"}"#,
                "unknown algorithm `nope`",
            ),
            (
                r#"{"algorithm":"gcra","rate":1,"per":"1s"}"#,
                "needs `burst`",
            ),
            (
                r#"{"algorithm":"gcra","rate":1,"per":"1s","burst":1,"window":"1s"}"#,
                "`window` does not apply",
            ),
            (
                r#"{"algorithm":"fixed_window","limit":0,"window":"1s"}"#,
                "`limit` must be between 1 and 1000000000, not 0",
            ),
            (
                r#"{"algorithm":"sliding_log","limit":100001,"window":"1s"}"#,
                "between 1 and 100000",
            ),
            (
                r#"{"algorithm":"fixed_window","limit":1,"window":"31d"}"#,
                "`window` must be at most 30d",
            ),
            (
                r#"{"algorithm":"fixed_window","limit":1,"window":"1 s"}"#,
                "is not a duration",
            ),
            (
                r#"{"algorithm":"fixed_window","limit":1,"window":"1s","extra":1}"#,
                "unknown field `extra`",
            ),
            (
                r#"{"algorithm":"leaky_bucket","rate":1,"per":"1s","burst":1,"mode":"shaping"}"#,
                "needs `max_wait`",
            ),
            (
                r#"{"algorithm":"leaky_bucket","rate":1,"per":"1s","burst":1,"max_wait":"1s"}"#,
                "`max_wait` does not apply",
            ),
            (
                r#"{"algorithm":"leaky_bucket","rate":1,"per":"1s","burst":1,"mode":"drip"}"#,
                "`mode` must be",
            ),
            (
                r#"{"algorithm":"token_bucket","rate":-1,"per":"1s","burst":1}"#,
                "invalid value: integer `-1`",
            ),
            (
                r#"{"algorithm":"gcra","rate":1,"per":"1d","burst":3651}"#,
                "must be at most 3650d, not 3651 days",
            ),
        ];
        for (json, expected) in cases {
            let err = parse(json).unwrap_err();
            assert!(err.contains(expected), "{json}: {err}");
        }
    }

    #[test]
    fn the_admission_bound_follows_the_documented_table() {
        let fw = parse(r#"{"algorithm":"fixed_window","limit":10,"window":"1s"}"#).unwrap();
        assert_eq!(fw.admission_bound(1000), 20);
        let log = parse(r#"{"algorithm":"sliding_log","limit":10,"window":"1s"}"#).unwrap();
        assert_eq!(log.admission_bound(1000), 10);
        let gcra = parse(r#"{"algorithm":"gcra","rate":10,"per":"1s","burst":5}"#).unwrap();
        assert_eq!(gcra.admission_bound(1000), 15);
    }
}
