//! The report as terminal tables.

use std::fmt::Write as _;

use super::{Clock, Report};
use crate::trace::format_time;
use crate::trace::timing::Resolution;

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn dash(n: u64) -> String {
    if n == 0 { "-".to_owned() } else { thousands(n) }
}

/// A period in ms as a duration users write (`1s`, `1m`, `1500ms`).
pub fn period(ms: u64) -> String {
    sluice_core::duration::Millis::new(ms).map_or_else(|| "0ms".to_owned(), |m| m.to_string())
}

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

pub(super) fn render(report: &Report) -> String {
    let mut out = String::new();
    header(report, &mut out);
    rules(report, &mut out);
    leases(report, &mut out);
    accuracy(report, &mut out);
    memory(report, &mut out);
    keys(report, &mut out);
    out
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
    for failure in &r.vm_failures {
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

fn rules(report: &Report, out: &mut String) {
    let mut table = Table::new(
        &[
            "rule",
            "offered",
            "allowed",
            "denied",
            "cached",
            "shadow",
            "skipped",
            "failed",
            "local",
            "callouts/1k",
            "keys",
        ],
        1,
    );
    for r in &report.rules {
        let c = &r.counts;
        table.row(vec![
            if r.shadow {
                format!("{} (shadow)", r.rule)
            } else {
                r.rule.clone()
            },
            thousands(c.offered),
            thousands(c.allowed),
            dash(c.denied),
            dash(c.cached_deny),
            dash(c.shadow_denied),
            dash(c.skipped),
            dash(c.failed),
            dash(c.local),
            r.callouts_per_thousand()
                .map_or_else(|| "?".to_owned(), |c| format!("{c:.1}")),
            thousands(r.keys),
        ]);
    }
    table.render(out);
    let _ = writeln!(
        out,
        "  (cached: denied from the local deny cache, no callout; shadow: a shadow rule that would have denied;\n   skipped: another rule denied the request, so this one consumed nothing; local: decided in Envoy from a lease;\n   callouts/1k: callouts carrying the rule, per request or lease asks, per 1,000 requests it applied to)"
    );
    let _ = writeln!(out);
}

fn leases(report: &Report, out: &mut String) {
    if report.rules.iter().all(|r| r.lease.is_none()) {
        return;
    }
    let _ = writeln!(out, "leases (units handed to each Envoy ahead of need)");
    let mut table = Table::new(
        &[
            "rule",
            "asks",
            "units granted",
            "empty answers",
            "no answer",
            "may hold",
        ],
        1,
    );
    for r in &report.rules {
        let Some(l) = &r.lease else { continue };
        table.row(vec![
            r.rule.clone(),
            thousands(l.asks),
            thousands(l.units),
            dash(l.empty),
            dash(l.failures),
            thousands(l.max_outstanding),
        ]);
    }
    table.render(out);
    let _ = writeln!(
        out,
        "  (empty answers: the algorithm admitted nothing then; may hold: the units all Envoys together may hold for one key,\n   which the bound below adds to the algorithm's own)"
    );
    let _ = writeln!(out);
}

fn accuracy(report: &Report, out: &mut String) {
    if report.rules.iter().all(|r| r.accuracy.is_none()) {
        return;
    }
    let _ = writeln!(
        out,
        "accuracy against the exact limit of each rule's nominal rate"
    );
    let mut table = Table::new(
        &[
            "rule",
            "algorithm",
            "nominal",
            "admitted",
            "over exact",
            "denied under exact",
            "peak in a period",
            "own bound",
            "over bound",
            "exact admits",
            "denied, exact admits",
            "admitted, exact denies",
            "denied, own algorithm admits",
            "admitted, own denies",
        ],
        2,
    );
    let mut notes = Vec::new();
    for r in &report.rules {
        let Some(a) = &r.accuracy else { continue };
        let exact = a.exact.as_ref();
        table.row(vec![
            r.rule.clone(),
            r.limit
                .map_or_else(String::new, |l| l.algorithm().to_string()),
            format!("{}/{}", thousands(a.units), period(a.period_ms)),
            thousands(a.admitted),
            dash(a.over_exact),
            dash(a.denied_under_exact),
            a.peak
                .as_ref()
                .map_or_else(|| "-".to_owned(), |p| thousands(p.admitted)),
            thousands(a.bound),
            dash(a.over_bound),
            exact.map_or_else(|| "n/a".to_owned(), |e| thousands(e.admitted)),
            exact.map_or_else(|| "n/a".to_owned(), |e| dash(e.denied_but_exact_admits)),
            exact.map_or_else(|| "n/a".to_owned(), |e| dash(e.admitted_but_exact_denies)),
            dash(a.own_algorithm.denied_but_exact_admits),
            dash(a.own_algorithm.admitted_but_exact_denies),
        ]);
        if let Some(p) = &a.peak
            && p.admitted > a.units
        {
            notes.push(format!(
                "  {}: key {} had {} admitted in the {} up to {}",
                r.rule,
                p.key,
                thousands(p.admitted),
                period(a.period_ms),
                format_time(p.at_us)
            ));
        }
        if a.lease_allowance > 0 {
            notes.push(format!(
                "  {}: bound {} = the algorithm's own {} + {} units its Envoys may hold (lease)",
                r.rule,
                thousands(a.bound),
                thousands(a.bound - a.lease_allowance),
                thousands(a.lease_allowance)
            ));
        }
        if let Some(local) = &a.per_instance {
            notes.push(format!(
                "  {}: with a separate limit in each of the {} Envoys, {} requests would have been admitted instead of {} ({:+})",
                r.rule,
                local.instances,
                thousands(local.admitted),
                thousands(a.admitted),
                local.admitted as i64 - a.admitted as i64
            ));
        }
    }
    table.render(out);
    let _ = writeln!(
        out,
        "  (over exact: admitted requests that took their key over the nominal rate in the period ending with them;\n   denied under exact: denied requests whose key, given what it had admitted in the period ending with them, had room;\n   over bound: the same against the algorithm's own bound, never above zero unless something is broken;\n   exact admits: what an exact sliding-log limit of the nominal rate would admit of the same requests;\n   own algorithm: the rule's algorithm deciding each request exactly as it came, one state per key)"
    );
    for note in notes {
        let _ = writeln!(out, "{note}");
    }
    let _ = writeln!(out);
}

fn memory(report: &Report, out: &mut String) {
    if let Some(note) = &report.memory_note {
        let _ = writeln!(out, "redis memory: not measured ({note})");
        let _ = writeln!(out);
        return;
    }
    if report.rules.iter().all(|r| r.memory.is_none()) {
        return;
    }
    let _ = writeln!(
        out,
        "redis memory of the limit keys at the end of the replay"
    );
    let mut table = Table::new(&["rule", "keys", "bytes/key", "largest", "total"], 1);
    for r in &report.rules {
        let Some(m) = &r.memory else { continue };
        table.row(vec![
            r.rule.clone(),
            thousands(m.keys),
            thousands(m.mean_bytes()),
            thousands(m.max_bytes),
            thousands(m.bytes),
        ]);
    }
    table.render(out);
    let _ = writeln!(
        out,
        "  (MEMORY USAGE of every key; idle keys expire after their longest window in production)"
    );
    if let Some(caveat) = report.memory_caveat() {
        let _ = writeln!(out, "  ({caveat})");
    }
    let _ = writeln!(out);
}

fn keys(report: &Report, out: &mut String) {
    if report.top_limited.is_empty() {
        let _ = writeln!(out, "no key was limited");
        return;
    }
    let _ = writeln!(
        out,
        "most limited keys ({} of {} limited)",
        report.top_limited.len(),
        thousands(report.limited_keys)
    );
    let mut table = Table::new(
        &[
            "rule", "key", "offered", "allowed", "denied", "cached", "shadow",
        ],
        2,
    );
    for k in &report.top_limited {
        let c = &k.counts;
        table.row(vec![
            k.rule.clone(),
            match &k.client {
                Some(client) => format!("{} ({client})", k.key),
                None => k.key.clone(),
            },
            thousands(c.offered),
            thousands(c.allowed),
            dash(c.denied),
            dash(c.cached_deny),
            dash(c.shadow_denied),
        ]);
    }
    table.render(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }

    #[test]
    fn tables_align_numbers_right() {
        let mut table = Table::new(&["rule", "n"], 1);
        table.row(vec!["a".to_owned(), "1,000".to_owned()]);
        let mut out = String::new();
        table.render(&mut out);
        assert_eq!(out, "rule      n\na     1,000\n");
    }
}
