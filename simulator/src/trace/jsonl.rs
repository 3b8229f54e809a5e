//! sluice's own trace format: one JSON object per line.
//!
//! ```text
//! {"time": "2024-05-01T12:00:00.250Z", "client": "203.0.113.7", "method": "GET",
//!  "path": "/api/items?page=2", "host": "api.example.com", "status": 200, "bytes": 512,
//!  "headers": {"x-api-key": "k-123"}}
//! ```
//!
//! `time` is RFC 3339, or seconds since the epoch (fractions allowed). Only `time`, `client` and
//! `path` are required; `method` defaults to GET, `status` to 200.

use std::collections::BTreeMap;
use std::io::Write;

use serde::{Deserialize, Serialize};

use super::record::{
    TraceRecord, checked_method, checked_target, format_time, time_from_rfc3339, time_from_seconds,
};

#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Time {
    Seconds(f64),
    Text(String),
}

/// Read by type rather than `#[serde(untagged)]`, which buffers the value and builds an error
/// for each variant it tries: a text time, the common case, failed `Seconds` first on every
/// line of the trace.
impl<'de> Deserialize<'de> for Time {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Time, D::Error> {
        struct TimeVisitor;
        impl serde::de::Visitor<'_> for TimeVisitor {
            type Value = Time;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("RFC 3339 text or seconds since the epoch")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Time, E> {
                Ok(Time::Text(v.to_owned()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Time, E> {
                Ok(Time::Seconds(v))
            }
            #[allow(clippy::cast_precision_loss)] // seconds since the epoch fit f64 exactly
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Time, E> {
                Ok(Time::Seconds(v as f64))
            }
            #[allow(clippy::cast_precision_loss)] // as above
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Time, E> {
                Ok(Time::Seconds(v as f64))
            }
        }
        deserializer.deserialize_any(TimeVisitor)
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    time: Time,
    client: String,
    #[serde(default = "get", skip_serializing_if = "is_get")]
    method: String,
    path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    host: Option<String>,
    #[serde(default = "ok", skip_serializing_if = "is_ok")]
    status: u16,
    #[serde(default, skip_serializing_if = "is_zero")]
    bytes: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    headers: BTreeMap<String, String>,
}

fn get() -> String {
    "GET".to_owned()
}
fn is_get(m: &str) -> bool {
    m == "GET"
}
fn ok() -> u16 {
    200
}
fn is_ok(s: &u16) -> bool {
    *s == 200
}
fn is_zero(b: &u64) -> bool {
    *b == 0
}

pub(super) fn parse_line(line: &str) -> Result<TraceRecord, String> {
    let parsed: Line = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let time_us = match &parsed.time {
        Time::Seconds(s) => time_from_seconds(*s)?,
        Time::Text(t) => time_from_rfc3339(t)?,
    };
    let target = checked_target(parsed.path)?;
    let method = checked_method(parsed.method)?;
    Ok(TraceRecord {
        line: 0,
        time_us,
        client: parsed.client,
        method,
        target,
        host: parsed.host,
        status: parsed.status,
        bytes: parsed.bytes,
        headers: parsed
            .headers
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect(),
    })
}

/// Writes records in this format.
pub fn write(out: &mut impl Write, records: &[TraceRecord]) -> std::io::Result<()> {
    for r in records {
        let line = Line {
            time: Time::Text(format_time(r.time_us)),
            client: r.client.clone(),
            method: r.method.clone(),
            path: r.target.clone(),
            host: r.host.clone(),
            status: r.status,
            bytes: r.bytes,
            headers: r.headers.iter().cloned().collect(),
        };
        serde_json::to_writer(&mut *out, &line)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let line = r#"{"time":"2024-05-01T12:00:00.250Z","client":"203.0.113.7","method":"POST","path":"/a?b","host":"h","status":201,"bytes":5,"headers":{"x-api-key":"k"}}"#;
        let record = parse_line(line).unwrap();
        assert_eq!(record.time_us, 1_714_564_800_250_000);
        let mut out = Vec::new();
        write(&mut out, &[record]).unwrap();
        assert_eq!(String::from_utf8(out).unwrap().trim_end(), line);
    }

    #[test]
    fn numeric_times_and_defaults() {
        let r = parse_line(r#"{"time":1714564800.5,"client":"c","path":"/"}"#).unwrap();
        assert_eq!(
            (r.time_us, r.method.as_str(), r.status),
            (1_714_564_800_500_000, "GET", 200)
        );
        let whole = parse_line(r#"{"time":1714564800,"client":"c","path":"/"}"#).unwrap();
        assert_eq!(whole.time_us, 1_714_564_800_000_000);
    }

    #[test]
    fn errors_name_the_problem() {
        for (line, expected) in [
            (r#"{"client":"c","path":"/"}"#, "missing field `time`"),
            (
                r#"{"time":"yesterday","client":"c","path":"/"}"#,
                "time `yesterday`",
            ),
            (r#"{"time":1,"client":"c","path":"x"}"#, "must start with /"),
            (
                r#"{"time":true,"client":"c","path":"/"}"#,
                "expected RFC 3339 text or seconds since the epoch",
            ),
            (
                r#"{"time":1,"client":"c","path":"/","colour":1}"#,
                "unknown field `colour`",
            ),
        ] {
            let err = parse_line(line).unwrap_err();
            assert!(err.contains(expected), "{line}: {err}");
        }
    }
}
