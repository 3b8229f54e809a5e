//! A limit as written ([`RawLimit`]), and its validation into a [`Limit`]: every parameter the
//! algorithm needs, none it does not, each in its bounds ([`LimitError`] names the field).

use serde::{Deserialize, Serialize};

use super::{
    Algorithm, BucketLimit, LeakMode, LeakyLimit, Limit, MAX_AMOUNT, MAX_DURATION_MS, MAX_FILL_MS,
    MAX_LOG_ENTRIES, WindowLimit,
};
use crate::duration::Millis;

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
