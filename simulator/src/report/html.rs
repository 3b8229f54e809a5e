//! The report as one self-contained HTML page: tables and inline SVG charts, no scripts, no
//! external files.

use std::fmt::Write as _;

pub use super::markup::escape;
use super::tables::{self, period, thousands};
use super::{Report, Series, charts};

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:960px;color:#222}\
table{border-collapse:collapse;margin:0.5em 0 1.5em}th,td{padding:0.25em 0.7em;text-align:right;border-bottom:1px solid #ddd}\
th:first-child,td:first-child{text-align:left}th{background:#f4f4f4}.note{color:#555;font-size:0.9em}\
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em}figure{margin:0}";

/// The start of a page titled `title`.
pub fn open(title: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body>\n<h1>{}</h1>\n",
        escape(title),
        escape(title)
    )
}

/// The end of a page.
pub fn close() -> &'static str {
    "</body></html>\n"
}

/// An HTML table of `header` and `rows` (cells already escaped).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::from("<table><tr>");
    for h in header {
        let _ = write!(out, "<th>{}</th>", escape(h));
    }
    out.push_str("</tr>\n");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
    out
}

fn timeline_figure(title: &str, report: &Report, series: &Series) -> String {
    format!(
        "<figure>{}</figure>\n",
        charts::allowed_and_limited(
            title,
            report.timeline.start_us,
            report.timeline.step_ms,
            &series.allowed,
            &series.limited,
        )
    )
}

/// One of the report's tables: its heading, the table, what its columns mean, and notes.
fn section(table: &tables::Table) -> String {
    let mut out = format!("<h2>{}</h2>\n", escape(table.title));
    if let Some(about) = &table.about {
        let _ = writeln!(
            out,
            "<p class=\"note\">{}.</p>",
            escape(&capitalized(about))
        );
    }
    let rows: Vec<Vec<String>> = table
        .rows
        .iter()
        .map(|row| row.iter().map(|cell| escape(cell)).collect())
        .collect();
    out.push_str(&self::table(&table.header, &rows));
    if !table.legend.is_empty() {
        let _ = writeln!(
            out,
            "<p class=\"note\">{}.</p>",
            escape(&capitalized(&table.legend.join("; ")))
        );
    }
    for note in &table.notes {
        let _ = writeln!(out, "<p class=\"note\">{}</p>", escape(note));
    }
    out
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

/// Each rule's errors against the exact limit and its own bound, as bars.
fn accuracy_figure(report: &Report) -> String {
    let accurate: Vec<_> = report
        .rules
        .iter()
        .filter_map(|r| Some((r, r.accuracy.as_ref()?)))
        .collect();
    let names: Vec<String> = accurate.iter().map(|(r, _)| r.rule.clone()).collect();
    let pick = |f: fn(&crate::accuracy::Accuracy) -> u64| {
        accurate.iter().map(|(_, a)| f(a)).collect::<Vec<u64>>()
    };
    format!(
        "<figure>{}</figure>\n",
        charts::grouped_bars(
            "accuracy per rule",
            &names,
            &[
                ("admitted over the exact limit", pick(|a| a.over_exact)),
                (
                    "denied, though an exact limiter admits",
                    pick(|a| a.exact.as_ref().map_or(0, |e| e.denied_but_exact_admits)),
                ),
                (
                    "admitted over the algorithm's own bound",
                    pick(|a| a.over_bound),
                ),
            ],
        )
    )
}

/// The page for a replay's report.
pub fn page(report: &Report) -> String {
    let mut out = open("sluice-sim replay report");
    let t = &report.trace;
    let _ = writeln!(
        out,
        "<p>{} requests from <code>{}</code> ({}), {} .. {}.<br>Policy <code>{}</code>; {} Envoy &times; {} worker; {} callouts.</p>",
        thousands(t.requests),
        escape(&t.source),
        escape(&t.format),
        escape(&t.first),
        escape(&t.last),
        escape(&report.run.policy),
        report.run.instances,
        report.run.workers,
        thousands(report.run.callouts)
    );
    let _ = writeln!(
        out,
        "<p class=\"note\">{}</p>",
        escape(&t.timing.describe())
    );
    if t.reordered > 0 {
        let _ = writeln!(
            out,
            "<p class=\"note\">{} lines were logged out of time order.</p>",
            thousands(t.reordered as u64)
        );
    }
    if let Some(l) = &report.latency {
        let _ = writeln!(
            out,
            "<p>Callout latency: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms.</p>",
            l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms
        );
    }

    out.push_str(&section(&tables::rules(report)));
    if let Some(leases) = tables::leases(report) {
        out.push_str(&section(&leases));
    }
    let step = report.timeline.step_ms;
    for series in &report.timeline.rules {
        let title = format!(
            "rule {}: admitted and limited per {}",
            series.rule,
            period(step)
        );
        out.push_str(&timeline_figure(&title, report, series));
    }
    if let Some(accuracy) = tables::accuracy(report) {
        out.push_str(&section(&accuracy));
        out.push_str(&accuracy_figure(report));
    }
    if let Some(note) = &report.memory_note {
        let _ = writeln!(
            out,
            "<h2>Redis memory</h2>\n<p class=\"note\">Not measured: {}</p>",
            escape(note)
        );
    } else if let Some(memory) = tables::memory(report) {
        out.push_str(&section(&memory));
    }
    match tables::keys(report) {
        Some(keys) => out.push_str(&section(&keys)),
        None => out.push_str("<h2>Most limited keys</h2>\n<p>No key was limited.</p>\n"),
    }
    for series in &report.timeline.keys {
        let title = format!(
            "{} key {}: per {}",
            series.rule,
            series.key.as_deref().unwrap_or_default(),
            period(step)
        );
        out.push_str(&timeline_figure(&title, report, series));
    }
    out.push_str(close());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_keys_is_escaped() {
        assert_eq!(
            escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
