//! The report as terminal tables.

use std::fmt::Write as _;

use super::tables::{self, thousands};
use super::{Clock, Report};
use crate::trace::timing::Resolution;

/// A table: a header row and rows, columns right-aligned but for the first `left` ones.
struct Table {
    rows: Vec<Vec<String>>,
    left: usize,
}

impl Table {
    fn new(header: &[&str], left: usize) -> Table {
        Table {
            rows: vec![header.iter().map(|h| (*h).to_owned()).collect()],
            left,
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn render(&self, out: &mut String) {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for row in &self.rows {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                let pad = widths[c].saturating_sub(cell.chars().count());
                if c > 0 {
                    line.push_str("  ");
                }
                if c < self.left {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad));
                } else {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
}

/// Renders `header` and `rows` as a table into `out`, the first `left` columns left-aligned.
pub fn table(header: &[&str], rows: &[Vec<String>], left: usize, out: &mut String) {
    let mut table = Table::new(header, left);
    for row in rows {
        table.row(row.clone());
    }
    table.render(out);
}

impl Report {
    /// The terminal report.
    pub fn render(&self) -> String {
        render(self)
    }
}

fn render(report: &Report) -> String {
    let mut out = String::new();
    header(report, &mut out);
    section(&tables::rules(report), &mut out);
    for table in [tables::leases(report), tables::accuracy(report)]
        .into_iter()
        .flatten()
    {
        section(&table, &mut out);
    }
    match (&report.memory_note, tables::memory(report)) {
        (Some(note), _) => {
            let _ = writeln!(out, "redis memory: not measured ({note})");
            let _ = writeln!(out);
        }
        (None, Some(table)) => section(&table, &mut out),
        (None, None) => {}
    }
    match tables::keys(report) {
        Some(table) => section(&table, &mut out),
        None => {
            let _ = writeln!(out, "no key was limited");
        }
    }
    out
}

/// One of the report's tables: its heading, the columns aligned, what they mean, and notes.
fn section(table: &tables::Table, out: &mut String) {
    let title = table.title.to_lowercase();
    let _ = match &table.about {
        Some(about) => writeln!(out, "{title} ({about})"),
        None => writeln!(out, "{title}"),
    };
    let mut columns = Table::new(&table.header, table.name_columns);
    for row in &table.rows {
        columns.row(row.clone());
    }
    columns.render(out);
    if !table.legend.is_empty() {
        let _ = writeln!(out, "  ({})", table.legend.join(";\n   "));
    }
    for note in &table.notes {
        let _ = writeln!(out, "  {note}");
    }
    let _ = writeln!(out);
}

fn header(report: &Report, out: &mut String) {
    let t = &report.trace;
    let _ = writeln!(
        out,
        "sluice-sim: {} requests from {} ({})",
        thousands(t.requests),
        t.source,
        t.format
    );
    let _ = writeln!(out, "  {} .. {}", t.first, t.last);
    if t.timing.resolution >= Resolution::Second {
        let _ = writeln!(out, "  {}", t.timing.describe());
    }
    if t.reordered > 0 {
        let _ = writeln!(
            out,
            "  warning: {} lines were logged out of time order; {}",
            thousands(t.reordered as u64),
            if t.timing.spread {
                "their logged times within a step are not real, so they replay in file order"
            } else {
                "they were sorted"
            }
        );
    }
    if t.skipped > 0 {
        let _ = writeln!(
            out,
            "  {} unreadable lines skipped",
            thousands(t.skipped as u64)
        );
    }
    let r = &report.run;
    let clock = match r.clock {
        Clock::Virtual { callout_latency_ms } => {
            format!("virtual time, each callout answered {callout_latency_ms} ms after it left")
        }
        Clock::RealTime { speed } => format!("real time at {speed}x"),
    };
    let leases = if r.lease_calls > 0 {
        format!(" ({} of them lease calls)", thousands(r.lease_calls))
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "  policy {}; {} Envoy x {} worker; {}; {} callouts{leases}",
        r.policy,
        r.instances,
        r.workers,
        clock,
        thousands(r.callouts)
    );
    if let Some(l) = &report.latency {
        let _ = writeln!(
            out,
            "  callout latency: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} callouts)",
            l.p50_ms,
            l.p90_ms,
            l.p99_ms,
            l.max_ms,
            thousands(l.samples as u64)
        );
    }
    if r.open_at_end > 0 {
        let _ = writeln!(
            out,
            "  {} requests never finished (hung streams)",
            r.open_at_end
        );
    }
    for failure in &r.failures {
        let _ = writeln!(out, "  {failure}");
    }
    if report.unreadable_records > 0 {
        let _ = writeln!(
            out,
            "  {} decision records could not be read (a filter bug)",
            report.unreadable_records
        );
    }
    let _ = writeln!(out);
    let statuses: Vec<String> = report
        .responses
        .iter()
        .map(|(s, n)| format!("{s}: {}", thousands(*n)))
        .collect();
    let _ = writeln!(out, "responses    {}", statuses.join("   "));
    if report.unmatched > 0 {
        let _ = writeln!(
            out,
            "             {} requests matched no rule",
            thousands(report.unmatched)
        );
    }
    let _ = writeln!(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_numbers_right() {
        let mut table = Table::new(&["rule", "n"], 1);
        table.row(vec!["a".to_owned(), "1,000".to_owned()]);
        let mut out = String::new();
        table.render(&mut out);
        assert_eq!(out, "rule      n\na     1,000\n");
    }
}
