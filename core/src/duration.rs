//! Durations as users write them: `100ms`, `1s`, `1m`, `1h`, `1d`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A whole number of milliseconds, at least 1, written with a unit suffix.
///
/// ```
/// use sluice_core::duration::Millis;
/// let d: Millis = "1m".parse().unwrap();
/// assert_eq!(d.as_millis(), 60_000);
/// assert_eq!(d.to_string(), "1m");
/// assert_eq!("1500ms".parse::<Millis>().unwrap().to_string(), "1500ms");
/// assert!("0s".parse::<Millis>().is_err());
/// assert!("10".parse::<Millis>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Millis(u64);

/// The units a duration may be written in, largest first (display picks the largest exact one).
const UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    /// The text is not a number followed by one of the units.
    #[error(
        "`{0}` is not a duration: write a whole number and a unit, as in 100ms, 1s, 1m, 1h or 1d"
    )]
    Syntax(String),
    /// Zero is never a useful window or period.
    #[error("`{0}` is zero: a duration must be at least 1ms")]
    Zero(String),
    /// The number does not fit.
    #[error("`{0}` is too long")]
    Overflow(String),
}

impl Millis {
    /// One millisecond, the shortest duration.
    pub const MIN: Millis = Millis(1);

    /// A duration of `ms` milliseconds; `None` for zero.
    pub const fn new(ms: u64) -> Option<Millis> {
        if ms == 0 { None } else { Some(Millis(ms)) }
    }

    /// The duration in milliseconds.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// The duration in microseconds, the unit every algorithm computes in.
    pub const fn as_micros(self) -> i64 {
        // Bounded by validation to far below i64::MAX (see `limit::MAX_DURATION`).
        (self.0 as i64).saturating_mul(1000)
    }
}

impl FromStr for Millis {
    type Err = DurationError;

    fn from_str(text: &str) -> Result<Millis, DurationError> {
        let digits_end = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(digits_end);
        let scale = UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, scale)| *scale)
            .ok_or_else(|| DurationError::Syntax(text.to_owned()))?;
        if number.is_empty() {
            return Err(DurationError::Syntax(text.to_owned()));
        }
        let count: u64 = number
            .parse()
            .map_err(|_| DurationError::Overflow(text.to_owned()))?;
        let ms = count
            .checked_mul(scale)
            .ok_or_else(|| DurationError::Overflow(text.to_owned()))?;
        Millis::new(ms).ok_or_else(|| DurationError::Zero(text.to_owned()))
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (unit, scale) = UNITS
            .iter()
            .find(|(_, scale)| self.0.is_multiple_of(*scale))
            .copied()
            .unwrap_or(("ms", 1));
        write!(f, "{}{}", self.0 / scale, unit)
    }
}

impl Serialize for Millis {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Millis, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Millis {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^[0-9]+(ms|s|m|h|d)$",
            "description": "A whole number and a unit: 100ms, 1s, 1m, 1h, 1d; at least 1ms, at most 30d.",
            "examples": ["100ms", "1s", "1m"]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        for (text, ms) in [
            ("100ms", 100),
            ("1s", 1000),
            ("2m", 120_000),
            ("1h", 3_600_000),
            ("1d", 86_400_000),
        ] {
            assert_eq!(
                text.parse::<Millis>().map(Millis::as_millis),
                Ok(ms),
                "{text}"
            );
        }
    }

    #[test]
    fn refuses_what_is_not_a_duration() {
        for text in ["", "s", "1", "1 s", "1.5s", "-1s", "1sec", "1S", "ms"] {
            assert!(
                matches!(text.parse::<Millis>(), Err(DurationError::Syntax(_))),
                "{text:?} should be a syntax error"
            );
        }
        assert!(matches!(
            "0ms".parse::<Millis>(),
            Err(DurationError::Zero(_))
        ));
        assert!(matches!(
            "99999999999999999999d".parse::<Millis>(),
            Err(DurationError::Overflow(_))
        ));
    }

    #[test]
    fn displays_in_the_largest_exact_unit_and_round_trips() {
        for ms in [
            1,
            999,
            1000,
            1500,
            60_000,
            90_000,
            3_600_000,
            86_400_000,
            172_800_000,
        ] {
            let d = Millis::new(ms).unwrap();
            assert_eq!(d.to_string().parse::<Millis>(), Ok(d));
        }
        assert_eq!(Millis::new(90_000).unwrap().to_string(), "90s");
    }
}
