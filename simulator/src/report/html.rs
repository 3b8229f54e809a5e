//! The report as one self-contained HTML page: tables and inline SVG charts, no scripts, no
//! external files.

use std::fmt::Write as _;

pub use super::markup::escape;
use super::text::{period, thousands};
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

    out.push_str("<h2>Rules</h2>\n");
    let rows: Vec<Vec<String>> = report
        .rules
        .iter()
        .map(|r| {
            let c = &r.counts;
            vec![
                format!(
                    "{}{}",
                    escape(&r.rule),
                    if r.shadow { " (shadow)" } else { "" }
                ),
                thousands(c.offered),
                thousands(c.allowed),
                thousands(c.denied),
                thousands(c.cached_deny),
                thousands(c.shadow_denied),
                thousands(c.skipped),
                thousands(c.failed),
                thousands(c.local),
                r.callouts_per_thousand()
                    .map_or_else(|| "?".to_owned(), |c| format!("{c:.1}")),
                thousands(r.keys),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "rule",
            "offered",
            "allowed",
            "denied",
            "cached",
            "shadow",
            "skipped",
            "failed",
            "decided in Envoy",
            "callouts per 1,000",
            "keys",
        ],
        &rows,
    ));
    let leased: Vec<Vec<String>> = report
        .rules
        .iter()
        .filter_map(|r| {
            let l = r.lease.as_ref()?;
            Some(vec![
                escape(&r.rule),
                thousands(l.asks),
                thousands(l.units),
                thousands(l.empty),
                thousands(l.failures),
                thousands(l.max_outstanding),
            ])
        })
        .collect();
    if !leased.is_empty() {
        out.push_str("<h3>Leases</h3>\n<p class=\"note\">Units handed to each Envoy ahead of need. Empty answers: the algorithm admitted nothing then. May hold: the units all Envoys together may hold for one key, which the bound adds to the algorithm's own.</p>\n");
        out.push_str(&table(
            &[
                "rule",
                "asks",
                "units granted",
                "empty answers",
                "no answer",
                "may hold",
            ],
            &leased,
        ));
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

    let accurate: Vec<_> = report
        .rules
        .iter()
        .filter_map(|r| Some((r, r.accuracy.as_ref()?)))
        .collect();
    if !accurate.is_empty() {
        out.push_str("<h2>Accuracy</h2>\n<p class=\"note\">Against the exact limit of each rule's nominal rate (at most that many in any interval of its period), and against the algorithm's own bound.</p>\n");
        let rows: Vec<Vec<String>> = accurate
            .iter()
            .map(|(r, a)| {
                let exact = a.exact.as_ref();
                let na = || "n/a".to_owned();
                vec![
                    escape(&r.rule),
                    format!("{}/{}", thousands(a.units), period(a.period_ms)),
                    thousands(a.admitted),
                    thousands(a.over_exact),
                    a.peak.as_ref().map_or_else(
                        || "-".to_owned(),
                        |p| format!("{} ({})", thousands(p.admitted), escape(&p.key)),
                    ),
                    thousands(a.bound),
                    thousands(a.over_bound),
                    exact.map_or_else(na, |e| thousands(e.admitted)),
                    exact.map_or_else(na, |e| thousands(e.denied_but_exact_admits)),
                    exact.map_or_else(na, |e| thousands(e.admitted_but_exact_denies)),
                    a.per_instance
                        .as_ref()
                        .map_or_else(|| "-".to_owned(), |p| thousands(p.admitted)),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "rule",
                "nominal",
                "admitted",
                "over exact",
                "peak in a period (key)",
                "bound (with leases)",
                "over bound",
                "exact admits",
                "denied, exact admits",
                "admitted, exact denies",
                "per-instance limits admit",
            ],
            &rows,
        ));
        let names: Vec<String> = accurate.iter().map(|(r, _)| r.rule.clone()).collect();
        let pick = |f: fn(&crate::accuracy::Accuracy) -> u64| {
            accurate.iter().map(|(_, a)| f(a)).collect::<Vec<u64>>()
        };
        out.push_str("<figure>");
        out.push_str(&charts::grouped_bars(
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
        ));
        out.push_str("</figure>\n");
    }

    if let Some(note) = &report.memory_note {
        let _ = writeln!(
            out,
            "<h2>Redis memory</h2>\n<p class=\"note\">Not measured: {}</p>",
            escape(note)
        );
    } else if report.rules.iter().any(|r| r.memory.is_some()) {
        out.push_str("<h2>Redis memory</h2>\n");
        let rows: Vec<Vec<String>> = report
            .rules
            .iter()
            .filter_map(|r| {
                let m = r.memory.as_ref()?;
                Some(vec![
                    escape(&r.rule),
                    thousands(m.keys),
                    thousands(m.mean_bytes()),
                    thousands(m.max_bytes),
                    thousands(m.bytes),
                ])
            })
            .collect();
        out.push_str(&table(
            &["rule", "keys", "bytes/key", "largest", "total"],
            &rows,
        ));
        if let Some(caveat) = report.memory_caveat() {
            let _ = writeln!(out, "<p class=\"note\">{}</p>", escape(&caveat));
        }
    }

    out.push_str("<h2>Most limited keys</h2>\n");
    let rows: Vec<Vec<String>> = report
        .top_limited
        .iter()
        .map(|k| {
            vec![
                escape(&k.rule),
                escape(&match &k.client {
                    Some(client) => format!("{} ({client})", k.key),
                    None => k.key.clone(),
                }),
                thousands(k.counts.offered),
                thousands(k.counts.allowed),
                thousands(k.counts.limited()),
            ]
        })
        .collect();
    if rows.is_empty() {
        out.push_str("<p>No key was limited.</p>\n");
    } else {
        out.push_str(&table(
            &["rule", "key", "offered", "allowed", "limited"],
            &rows,
        ));
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
