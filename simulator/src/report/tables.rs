//! The report's tables, built once from a [`Report`] for both renderers: [`super::text`] draws
//! them as aligned columns, [`super::html`] as HTML tables beside its charts. What a column
//! holds, what it is called and what it means are decided here and nowhere else.

use super::{Report, RuleReport};
use crate::trace::format_time;

/// One table of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// Its heading.
    pub title: &'static str,
    /// What it shows, beside the heading; `None` when the heading says it all.
    pub about: Option<String>,
    /// The column names.
    pub header: Vec<&'static str>,
    /// The cells, as plain text: each renderer escapes or aligns them.
    pub rows: Vec<Vec<String>>,
    /// How many leading columns hold names; the rest hold numbers.
    pub name_columns: usize,
    /// What the columns mean, one `column: meaning` each.
    pub legend: Vec<String>,
    /// What stands out in particular rows.
    pub notes: Vec<String>,
}

impl Table {
    fn new(title: &'static str, header: &[&'static str], name_columns: usize) -> Table {
        Table {
            title,
            about: None,
            header: header.to_vec(),
            rows: Vec::new(),
            name_columns,
            legend: Vec::new(),
            notes: Vec::new(),
        }
    }

    fn about(mut self, about: impl Into<String>) -> Table {
        self.about = Some(about.into());
        self
    }

    fn legend(mut self, entries: &[&str]) -> Table {
        self.legend = entries.iter().map(|e| (*e).to_owned()).collect();
        self
    }
}

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

/// A count where none is the news: `-` for 0, so the rows that have some stand out.
fn dash(n: u64) -> String {
    if n == 0 { "-".to_owned() } else { thousands(n) }
}

/// A period in ms as a duration users write (`1s`, `1m`, `1500ms`).
pub fn period(ms: u64) -> String {
    sluice_core::duration::Millis::new(ms).map_or_else(|| "0ms".to_owned(), |m| m.to_string())
}

/// What each rule decided.
pub fn rules(report: &Report) -> Table {
    let mut table = Table::new(
        "Rules",
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
    )
    .legend(&[
        "cached: denied from the local deny cache, no callout",
        "shadow: a shadow rule that would have denied",
        "skipped: another rule denied the request, so this one consumed nothing",
        "local: decided in Envoy from a lease",
        "callouts/1k: callouts carrying the rule, per request or lease asks, per 1,000 requests it applied to (?: not known for this way in)",
    ]);
    for r in &report.rules {
        let c = &r.counts;
        table.rows.push(vec![
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
            callouts_per_thousand(r),
            thousands(r.keys),
        ]);
    }
    table
}

/// A rule's callouts per 1,000 requests: `-` for a rule no request applied to, `?` where the
/// way in does not say how many callouts carried the rule.
fn callouts_per_thousand(rule: &RuleReport) -> String {
    if rule.counts.offered == 0 {
        return "-".to_owned();
    }
    rule.callouts_per_thousand()
        .map_or_else(|| "?".to_owned(), |c| format!("{c:.1}"))
}

/// The leases of the rules that lease; `None` when none does.
pub fn leases(report: &Report) -> Option<Table> {
    let mut table = Table::new(
        "Leases",
        &[
            "rule",
            "asks",
            "units granted",
            "empty answers",
            "no answer",
            "may hold",
        ],
        1,
    )
    .about("units handed to each Envoy ahead of need")
    .legend(&[
        "empty answers: the algorithm admitted nothing then",
        "may hold: the units all Envoys together may hold for one key, which the accuracy bound adds to the algorithm's own",
    ]);
    for r in &report.rules {
        let Some(l) = &r.lease else { continue };
        table.rows.push(vec![
            r.rule.clone(),
            thousands(l.asks),
            thousands(l.units),
            dash(l.empty),
            dash(l.failures),
            thousands(l.max_outstanding),
        ]);
    }
    (!table.rows.is_empty()).then_some(table)
}

/// Each rule's accuracy; `None` when none was measured.
pub fn accuracy(report: &Report) -> Option<Table> {
    let mut table = Table::new(
        "Accuracy",
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
    )
    .about("against the exact limit of each rule's nominal rate, and the algorithm's own bound")
    .legend(&[
        "over exact: admitted requests that took their key over the nominal rate in the period ending with them",
        "denied under exact: denied requests whose key, given what it had admitted in the period ending with them, had room",
        "over bound: the same against the algorithm's own bound, never above zero unless something is broken",
        "exact admits: what an exact sliding-log limit of the nominal rate would admit of the same requests",
        "own algorithm: the rule's algorithm deciding each request exactly as it came, one state per key",
    ]);
    for r in &report.rules {
        let Some(a) = &r.accuracy else { continue };
        let exact = a.exact.as_ref();
        let na = || "n/a".to_owned();
        table.rows.push(vec![
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
            exact.map_or_else(na, |e| thousands(e.admitted)),
            exact.map_or_else(na, |e| dash(e.denied_but_exact_admits)),
            exact.map_or_else(na, |e| dash(e.admitted_but_exact_denies)),
            dash(a.own_algorithm.denied_but_exact_admits),
            dash(a.own_algorithm.admitted_but_exact_denies),
        ]);
        if let Some(p) = &a.peak
            && p.admitted > a.units
        {
            table.notes.push(format!(
                "{}: key {} had {} admitted in the {} up to {}",
                r.rule,
                p.key,
                thousands(p.admitted),
                period(a.period_ms),
                format_time(p.at_us)
            ));
        }
        if a.lease_allowance > 0 {
            table.notes.push(format!(
                "{}: bound {} = the algorithm's own {} + {} units its Envoys may hold (lease)",
                r.rule,
                thousands(a.bound),
                thousands(a.bound - a.lease_allowance),
                thousands(a.lease_allowance)
            ));
        }
        if let Some(local) = &a.per_instance {
            table.notes.push(format!(
                "{}: with a separate limit in each of the {} Envoys, {} requests would have been admitted instead of {} ({:+})",
                r.rule,
                local.instances,
                thousands(local.admitted),
                thousands(a.admitted),
                local.admitted as i64 - a.admitted as i64
            ));
        }
    }
    (!table.rows.is_empty()).then_some(table)
}

/// The Redis memory of each rule's keys; `None` when it was not measured (see
/// [`Report::memory_note`]).
pub fn memory(report: &Report) -> Option<Table> {
    let mut table = Table::new(
        "Redis memory",
        &["rule", "keys", "bytes/key", "largest", "total"],
        1,
    )
    .about("of the limit keys at the end of the replay")
    .legend(&[
        "MEMORY USAGE of every key; idle keys expire after their longest window in production",
    ]);
    for r in &report.rules {
        let Some(m) = &r.memory else { continue };
        table.rows.push(vec![
            r.rule.clone(),
            thousands(m.keys),
            thousands(m.mean_bytes()),
            thousands(m.max_bytes),
            thousands(m.bytes),
        ]);
    }
    table.notes.extend(report.memory_caveat());
    (report.memory_note.is_none() && !table.rows.is_empty()).then_some(table)
}

/// The most limited keys; `None` when no key was limited.
pub fn keys(report: &Report) -> Option<Table> {
    let mut table = Table::new(
        "Most limited keys",
        &[
            "rule", "key", "offered", "allowed", "denied", "cached", "shadow",
        ],
        2,
    )
    .about(format!(
        "{} of {} limited",
        report.top_limited.len(),
        thousands(report.limited_keys)
    ));
    for k in &report.top_limited {
        let c = &k.counts;
        table.rows.push(vec![
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
    (!table.rows.is_empty()).then_some(table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Counts;

    fn rule(offered: u64, callouts: Option<u64>) -> RuleReport {
        RuleReport {
            rule: "per-client".to_owned(),
            limit: None,
            shadow: false,
            keys: 0,
            counts: Counts {
                offered,
                ..Counts::default()
            },
            callouts,
            lease: None,
            accuracy: None,
            memory: None,
        }
    }

    #[test]
    fn a_rules_callouts_per_thousand_say_when_no_request_applied_and_when_unknown() {
        assert_eq!(callouts_per_thousand(&rule(2000, Some(500))), "250.0");
        assert_eq!(callouts_per_thousand(&rule(0, Some(0))), "-");
        assert_eq!(callouts_per_thousand(&rule(0, None)), "-");
        assert_eq!(callouts_per_thousand(&rule(2000, None)), "?");
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }
}
