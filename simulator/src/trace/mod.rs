//! Traces: recorded requests to replay, read from access logs.
//!
//! Formats: nginx/Apache "combined" logs (with any number of extra quoted fields, such as the
//! `X-Forwarded-For` nginx configurations often append) and sluice's own JSON lines (see
//! [`jsonl`]). A bad line is an error naming the file and the line, or, when skipping bad lines,
//! a counted skip. Requests must come in time order; a trace that goes back in time is refused,
//! naming the line, unless sorting is asked for (then it is sorted, and the report says so).

mod combined;
pub mod jsonl;
pub mod synthetic;

use std::fmt;
use std::net::IpAddr;
use std::path::Path;

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

/// A trace's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Decide from the first line.
    Auto,
    /// nginx/Apache combined.
    Combined,
    /// sluice's JSON lines.
    Jsonl,
}

/// A line that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct TraceError {
    /// The file.
    pub file: String,
    /// The 1-based line.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// How to read.
#[derive(Debug, Clone, Copy)]
pub struct ReadOptions {
    /// The format.
    pub format: Format,
    /// Count bad lines and go on, instead of stopping at the first.
    pub skip_bad: bool,
    /// Sort records that are out of time order, instead of refusing the trace.
    pub sort: bool,
}

impl Default for ReadOptions {
    fn default() -> ReadOptions {
        ReadOptions {
            format: Format::Auto,
            skip_bad: false,
            sort: false,
        }
    }
}

/// A trace read into memory, in time order.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// Where it came from.
    pub source: String,
    /// The records.
    pub records: Vec<TraceRecord>,
    /// Bad lines skipped.
    pub skipped: usize,
    /// The first few skipped lines' errors.
    pub skipped_examples: Vec<TraceError>,
    /// Records that were out of order and had to be sorted.
    pub reordered: usize,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Auto => "auto",
            Format::Combined => "combined",
            Format::Jsonl => "jsonl",
        })
    }
}

/// Reads a trace file.
pub fn read_file(path: &Path, options: ReadOptions) -> Result<Trace, TraceError> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| TraceError {
        file: name.clone(),
        line: 0,
        message: e.to_string(),
    })?;
    read_bytes(&name, &bytes, options)
}

/// Reads a trace from memory; `name` names it in errors.
pub fn read_bytes(name: &str, bytes: &[u8], options: ReadOptions) -> Result<Trace, TraceError> {
    let text = String::from_utf8_lossy(bytes);
    let format = match options.format {
        Format::Auto => detect(&text),
        f => f,
    };
    let mut trace = Trace {
        source: name.to_owned(),
        ..Trace::default()
    };
    let mut last_time = i64::MIN;
    let mut first_backwards: Option<(usize, i64)> = None;
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let parsed = match format {
            Format::Jsonl => jsonl::parse_line(line),
            _ => combined::parse_line(line),
        };
        match parsed {
            Ok(mut record) => {
                record.line = number;
                if record.time_us < last_time {
                    trace.reordered += 1;
                    first_backwards.get_or_insert((number, last_time));
                }
                last_time = last_time.max(record.time_us);
                trace.records.push(record);
            }
            Err(message) => {
                let error = TraceError {
                    file: name.to_owned(),
                    line: number,
                    message,
                };
                if !options.skip_bad {
                    return Err(error);
                }
                trace.skipped += 1;
                if trace.skipped_examples.len() < 5 {
                    trace.skipped_examples.push(error);
                }
            }
        }
    }
    if let Some((line, previous)) = first_backwards {
        if !options.sort {
            let record = trace
                .records
                .iter()
                .find(|r| r.line == line)
                .map_or(0, |r| r.time_us);
            return Err(TraceError {
                file: name.to_owned(),
                line,
                message: format!(
                    "goes back in time ({} after {}); {} of {} records are out of order: pass --sort to sort them",
                    format_time(record),
                    format_time(previous),
                    trace.reordered,
                    trace.records.len()
                ),
            });
        }
        trace.records.sort_by_key(|r| r.time_us);
    }
    if trace.records.is_empty() {
        return Err(TraceError {
            file: name.to_owned(),
            line: 0,
            message: "no request in the trace".to_owned(),
        });
    }
    Ok(trace)
}

fn detect(text: &str) -> Format {
    match text.lines().find(|l| !l.trim().is_empty()) {
        Some(line) if line.trim_start().starts_with('{') => Format::Jsonl,
        _ => Format::Combined,
    }
}

/// A time in microseconds as RFC 3339.
pub fn format_time(time_us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(time_us)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
        .unwrap_or_else(|| format!("{time_us}us"))
}

/// Gives clients that are not IP addresses (host names) an address of their own, in the order
/// they first appear, from 100.64.0.0/10 (shared address space, never a real client's).
#[derive(Debug, Default)]
pub struct ClientAddresses {
    names: std::collections::HashMap<String, IpAddr>,
    by_address: std::collections::HashMap<IpAddr, String>,
}

impl ClientAddresses {
    /// The address `client` is replayed from.
    pub fn address(&mut self, client: &str) -> IpAddr {
        if let Ok(ip) = client.parse::<IpAddr>() {
            return ip;
        }
        if let Some(ip) = self.names.get(client) {
            return *ip;
        }
        let n = self.names.len() as u32;
        let ip = IpAddr::from(std::net::Ipv4Addr::from(0x6440_0000 + (n % (1 << 22))));
        self.names.insert(client.to_owned(), ip);
        self.by_address.insert(ip, client.to_owned());
        ip
    }

    /// The client name an address was given to, if any.
    pub fn name_of(&self, address: &str) -> Option<&str> {
        let ip: IpAddr = address.parse().ok()?;
        self.by_address.get(&ip).map(String::as_str)
    }
}
