//! Traces: recorded requests to replay, read from access logs.
//!
//! Formats: nginx/Apache "combined" logs (with any number of extra quoted fields, such as the
//! `X-Forwarded-For` nginx configurations often append), Envoy's JSON access logs
//! ([`envoy_json`]), tab-separated logs with a header row ([`tsv`], as the NASA-HTTP trace), and
//! sluice's own JSON lines ([`jsonl`]). A bad line is an error naming the file and the line, or,
//! when skipping bad lines, a counted skip.
//!
//! Requests must come in time order: a trace that goes back in time is refused, naming the
//! line, unless sorting is asked for (then it is sorted, and the report says how many lines
//! were out of order). The timestamps' real resolution is measured ([`timing`]); traces whose
//! timing is only real to the minute or the hour are spread evenly over each step, in file
//! order, and the report says so.

mod combined;
pub mod envoy_json;
pub mod jsonl;
mod record;
pub mod synthetic;
pub mod timing;
pub mod tsv;

use std::fmt;
use std::net::IpAddr;
use std::path::Path;

pub use self::record::{TraceRecord, format_time};
use self::timing::{Spread, Timing};

/// A trace's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Decide from the first line.
    Auto,
    /// nginx/Apache combined.
    Combined,
    /// sluice's JSON lines.
    Jsonl,
    /// Envoy's JSON access log.
    EnvoyJson,
    /// Tab-separated, with a header row.
    Tsv,
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
    /// Whether to spread each timestamp step's requests over the step.
    pub spread: Spread,
}

impl Default for ReadOptions {
    fn default() -> ReadOptions {
        ReadOptions {
            format: Format::Auto,
            skip_bad: false,
            sort: false,
            spread: Spread::Auto,
        }
    }
}

/// A trace read into memory, in time order.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// Where it came from.
    pub source: String,
    /// The format it was read as.
    pub format: Option<Format>,
    /// The records.
    pub records: Vec<TraceRecord>,
    /// Bad lines skipped.
    pub skipped: usize,
    /// The first few skipped lines' errors.
    pub skipped_examples: Vec<TraceError>,
    /// Records logged out of time order (sorted, or replayed in file order within their step).
    pub reordered: usize,
    /// How precise the timestamps are, and whether they were spread.
    pub timing: Timing,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Auto => "auto",
            Format::Combined => "combined",
            Format::Jsonl => "jsonl",
            Format::EnvoyJson => "envoy-json",
            Format::Tsv => "tsv",
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

/// How lines are parsed, decided once from the format (and the header row).
enum Parser {
    Combined,
    Jsonl,
    EnvoyJson,
    Tsv(tsv::Columns),
}

impl Parser {
    fn parse(&self, line: &str) -> Result<TraceRecord, String> {
        match self {
            Parser::Combined => combined::parse_line(line),
            Parser::Jsonl => jsonl::parse_line(line),
            Parser::EnvoyJson => envoy_json::parse_line(line),
            Parser::Tsv(columns) => columns.parse_line(line),
        }
    }
}

/// Reads a trace from memory; `name` names it in errors.
pub fn read_bytes(name: &str, bytes: &[u8], options: ReadOptions) -> Result<Trace, TraceError> {
    let error = |line: usize, message: String| TraceError {
        file: name.to_owned(),
        line,
        message,
    };
    let text = String::from_utf8_lossy(bytes);
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.trim().is_empty())
        .peekable();
    let Some(&(first_number, first_line)) = lines.peek() else {
        return Err(error(0, "no request in the trace".to_owned()));
    };
    let format = match options.format {
        Format::Auto => detect(first_line),
        f => f,
    };
    let parser = match format {
        Format::Tsv => {
            let columns =
                tsv::Columns::from_header(first_line).map_err(|m| error(first_number, m))?;
            lines.next();
            Parser::Tsv(columns)
        }
        Format::Jsonl => Parser::Jsonl,
        Format::EnvoyJson => Parser::EnvoyJson,
        Format::Combined | Format::Auto => Parser::Combined,
    };
    let mut trace = Trace {
        source: name.to_owned(),
        format: Some(format),
        ..Trace::default()
    };
    for (number, line) in lines {
        match parser.parse(line) {
            Ok(mut record) => {
                record.line = number;
                trace.records.push(record);
            }
            Err(message) => {
                if !options.skip_bad {
                    return Err(error(
                        number,
                        format!("{message} (--skip-bad skips such lines and counts them)"),
                    ));
                }
                trace.skipped += 1;
                if trace.skipped_examples.len() < 5 {
                    trace.skipped_examples.push(error(number, message));
                }
            }
        }
    }
    if trace.records.is_empty() {
        return Err(error(0, "no request in the trace".to_owned()));
    }
    put_in_time_order(&mut trace, options).map_err(|(line, m)| error(line, m))?;
    Ok(trace)
}

/// Measures the timing, then orders (and perhaps spreads) the records, or says why it cannot.
fn put_in_time_order(trace: &mut Trace, options: ReadOptions) -> Result<(), (usize, String)> {
    let (resolution, evidence) = timing::detect(&trace.records);
    let spread = Timing::should_spread(resolution, options.spread);
    trace.timing = Timing {
        resolution,
        evidence,
        spread,
    };
    let mut latest = i64::MIN;
    let mut first_backwards = None;
    for record in &trace.records {
        if record.time_us < latest {
            trace.reordered += 1;
            first_backwards.get_or_insert((record.line, record.time_us, latest));
        }
        latest = latest.max(record.time_us);
    }
    // Spread traces keep file order within a step: only steps going back in time are disorder.
    let step_disorder = spread
        && trace
            .records
            .windows(2)
            .any(|w| timing::step(&w[1], resolution) < timing::step(&w[0], resolution));
    let refused = if spread {
        step_disorder
    } else {
        trace.reordered > 0
    };
    if let Some((line, time, previous)) = first_backwards
        && refused
        && !options.sort
    {
        let mut message = format!(
            "goes back in time ({} after {}); {} of {} records are out of order: pass --sort to sort them",
            format_time(time),
            format_time(previous),
            trace.reordered,
            trace.records.len()
        );
        if resolution >= timing::Resolution::Minute {
            message.push_str(&format!(
                " (note: {}; sorted records are replayed in file order within each {})",
                trace.timing.evidence,
                resolution.name()
            ));
        }
        return Err((line, message));
    }
    if spread {
        trace.records.sort_by_key(|r| timing::step(r, resolution));
        timing::spread_evenly(&mut trace.records, resolution);
    } else if trace.reordered > 0 {
        trace.records.sort_by_key(|r| r.time_us);
    }
    Ok(())
}

fn detect(first_line: &str) -> Format {
    let line = first_line.trim_start();
    if line.starts_with('{') {
        return match serde_json::from_str::<serde_json::Value>(line) {
            Ok(serde_json::Value::Object(o)) if envoy_json::looks_like(&o) => Format::EnvoyJson,
            _ => Format::Jsonl,
        };
    }
    if tsv::looks_like_header(line) {
        return Format::Tsv;
    }
    Format::Combined
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
