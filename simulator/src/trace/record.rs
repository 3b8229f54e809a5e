//! One recorded request, the checks every format's reader puts its fields through, and how
//! a time is written back.

/// One recorded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRecord {
    /// The line it was read from (1-based; 0 for generated records).
    pub line: usize,
    /// When it arrived, microseconds since the epoch.
    pub time_us: i64,
    /// The client as logged: an IP address, or an opaque name (a host name).
    pub client: String,
    /// The method.
    pub method: String,
    /// The request target: path and query.
    pub target: String,
    /// The `Host` the request was for, when logged.
    pub host: Option<String>,
    /// The status the upstream answered.
    pub status: u16,
    /// The response body's size.
    pub bytes: u64,
    /// Other request headers logged (user-agent, referer, x-forwarded-for, ...).
    pub headers: Vec<(String, String)>,
}

/// A time given as seconds since the epoch (fractions allowed).
pub(crate) fn time_from_seconds(seconds: f64) -> Result<i64, String> {
    if seconds.is_finite() && seconds.abs() < 1e13 {
        Ok((seconds * 1e6).round() as i64)
    } else {
        Err(format!(
            "time {seconds} is not a time in seconds since the epoch"
        ))
    }
}

/// A time given as RFC 3339.
pub(crate) fn time_from_rfc3339(text: &str) -> Result<i64, String> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_micros())
        .map_err(|e| format!("time `{text}`: {e} (expected RFC 3339, as 2024-05-01T12:00:00Z)"))
}

/// A method as HTTP writes it: capitals.
pub(crate) fn checked_method(method: String) -> Result<String, String> {
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(format!("method `{method}` must be capitals, as GET"));
    }
    Ok(method)
}

/// A status as logged (three digits); `field` names it in the error.
pub(crate) fn checked_status(text: &str, field: &str) -> Result<u16, String> {
    text.parse::<u16>()
        .ok()
        .filter(|s| (100..=999).contains(s))
        .ok_or_else(|| format!("{field} `{text}` is not an HTTP status"))
}

/// A request target: a path from the root, perhaps with a query.
pub(crate) fn checked_target(target: String) -> Result<String, String> {
    if !target.starts_with('/') {
        return Err(format!("path `{target}` must start with /"));
    }
    Ok(target)
}

/// A time in microseconds as RFC 3339.
pub fn format_time(time_us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(time_us)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
        .unwrap_or_else(|| format!("{time_us}us"))
}
