//! What a replay did: per rule and per key, from the filter's own decision records.
//!
//! The filter writes what it did with each rule into the request's filter state
//! ([`sluice_core::record`]); the report counts exactly that, so it says what the filter did,
//! not what the simulator guesses it did.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde::Serialize;
use sluice_core::record::{self, DECISION_PROPERTY, RuleOutcome};

use crate::envoy::Completed;
use crate::trace::ClientAddresses;

/// Counts of what happened to one rule, or one rule's key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Requests the rule applied to.
    pub offered: u64,
    /// Admitted.
    pub allowed: u64,
    /// Denied after a callout.
    pub denied: u64,
    /// Denied locally from the deny cache.
    pub cached_deny: u64,
    /// A shadow rule that would have denied.
    pub shadow_denied: u64,
    /// Not counted because an earlier rule denied.
    pub skipped: u64,
    /// No answer from the service.
    pub failed: u64,
    /// Admitted after a shaping delay.
    pub delayed: u64,
}

impl Counts {
    fn add(&mut self, outcome: RuleOutcome, delayed: bool) {
        self.offered += 1;
        match outcome {
            RuleOutcome::Allowed => self.allowed += 1,
            RuleOutcome::Denied => self.denied += 1,
            RuleOutcome::CachedDeny => self.cached_deny += 1,
            RuleOutcome::ShadowDenied => self.shadow_denied += 1,
            RuleOutcome::Skipped => self.skipped += 1,
            RuleOutcome::Failed => self.failed += 1,
        }
        self.delayed += u64::from(delayed);
    }

    /// Denied by the rule, with or without a callout, or would have been (shadow).
    pub fn limited(&self) -> u64 {
        self.denied + self.cached_deny + self.shadow_denied
    }
}

/// One key's line in the report.
#[derive(Debug, Clone, Serialize)]
pub struct KeyReport {
    /// The rule.
    pub rule: String,
    /// The key as the filter built it.
    pub key: String,
    /// The client name behind a synthetic address, when the trace logged names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// Its counts.
    #[serde(flatten)]
    pub counts: Counts,
}

/// One rule's line in the report.
#[derive(Debug, Clone, Serialize)]
pub struct RuleReport {
    /// The rule.
    pub rule: String,
    /// Distinct keys seen.
    pub keys: u64,
    /// Its counts.
    #[serde(flatten)]
    pub counts: Counts,
}

/// Collects completed requests into counts.
#[derive(Default)]
pub struct Collector {
    requests: u64,
    statuses: BTreeMap<u16, u64>,
    unmatched: u64,
    unreadable_records: u64,
    rules: BTreeMap<String, Counts>,
    keys: HashMap<(String, String), Counts>,
    first_ns: Option<u64>,
    last_ns: u64,
}

impl Collector {
    /// Counts one completed request.
    pub fn add(&mut self, done: &Completed) {
        self.requests += 1;
        *self.statuses.entry(done.status).or_default() += 1;
        self.first_ns = Some(
            self.first_ns
                .map_or(done.started_ns, |f| f.min(done.started_ns)),
        );
        self.last_ns = self.last_ns.max(done.ended_ns);
        let key = format!("wasm.{DECISION_PROPERTY}");
        let Some((_, bytes)) = done
            .filter_state
            .iter()
            .find(|(k, _)| k.as_slice() == key.as_bytes())
        else {
            self.unmatched += 1;
            return;
        };
        match record::decode(bytes) {
            Ok(lines) => {
                for line in lines {
                    let delayed = line.delay_ms > 0;
                    self.rules
                        .entry(line.rule.clone())
                        .or_default()
                        .add(line.outcome, delayed);
                    self.keys
                        .entry((line.rule, line.key))
                        .or_default()
                        .add(line.outcome, delayed);
                }
            }
            Err(_) => self.unreadable_records += 1,
        }
    }

    /// The report, with the `top` most limited keys.
    pub fn report(&self, top: usize, clients: &ClientAddresses) -> Summary {
        let rules = self
            .rules
            .iter()
            .map(|(rule, counts)| RuleReport {
                rule: rule.clone(),
                keys: self.keys.keys().filter(|(r, _)| r == rule).count() as u64,
                counts: counts.clone(),
            })
            .collect();
        let mut limited: Vec<KeyReport> = self
            .keys
            .iter()
            .filter(|(_, c)| c.limited() > 0)
            .map(|((rule, key), counts)| KeyReport {
                rule: rule.clone(),
                key: key.clone(),
                client: clients.name_of(key).map(str::to_owned),
                counts: counts.clone(),
            })
            .collect();
        limited.sort_by(|a, b| {
            b.counts
                .limited()
                .cmp(&a.counts.limited())
                .then(b.counts.offered.cmp(&a.counts.offered))
                .then(a.rule.cmp(&b.rule))
                .then(a.key.cmp(&b.key))
        });
        let limited_keys = limited.len() as u64;
        limited.truncate(top);
        Summary {
            requests: self.requests,
            statuses: self.statuses.clone(),
            unmatched: self.unmatched,
            unreadable_records: self.unreadable_records,
            virtual_seconds: (self
                .last_ns
                .saturating_sub(self.first_ns.unwrap_or(self.last_ns)))
                as f64
                / 1e9,
            rules,
            limited_keys,
            top_limited: limited,
        }
    }
}

/// The counts of a replay.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Requests replayed.
    pub requests: u64,
    /// Responses by status.
    pub statuses: BTreeMap<u16, u64>,
    /// Requests no rule applied to.
    pub unmatched: u64,
    /// Decision records the simulator could not read (a filter bug if ever non-zero).
    pub unreadable_records: u64,
    /// Virtual time covered.
    pub virtual_seconds: f64,
    /// Per rule.
    pub rules: Vec<RuleReport>,
    /// Keys limited at least once.
    pub limited_keys: u64,
    /// The most limited keys.
    pub top_limited: Vec<KeyReport>,
}

fn thousands(n: u64) -> String {
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

impl Summary {
    /// The terminal tables.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let statuses: Vec<String> = self
            .statuses
            .iter()
            .map(|(s, n)| format!("{s}: {}", thousands(*n)))
            .collect();
        let _ = writeln!(out, "responses    {}", statuses.join("   "));
        if self.unmatched > 0 {
            let _ = writeln!(
                out,
                "             {} requests matched no rule",
                thousands(self.unmatched)
            );
        }
        let _ = writeln!(out);
        let width = self
            .rules
            .iter()
            .map(|r| r.rule.len())
            .chain(self.top_limited.iter().map(|k| k.rule.len()))
            .max()
            .unwrap_or(4)
            .max(4);
        let _ = writeln!(
            out,
            "{:<width$}  {:>9}  {:>9}  {:>8}  {:>8}  {:>8}  {:>8}  {:>7}  {:>7}",
            "rule", "offered", "allowed", "denied", "cached", "shadow", "skipped", "failed", "keys"
        );
        for r in &self.rules {
            let c = &r.counts;
            let _ = writeln!(
                out,
                "{:<width$}  {:>9}  {:>9}  {:>8}  {:>8}  {:>8}  {:>8}  {:>7}  {:>7}",
                r.rule,
                thousands(c.offered),
                thousands(c.allowed),
                dash(c.denied),
                dash(c.cached_deny),
                dash(c.shadow_denied),
                dash(c.skipped),
                dash(c.failed),
                thousands(r.keys)
            );
        }
        let _ = writeln!(
            out,
            "  (cached: denied from the local deny cache, no callout; shadow: a shadow rule that would have denied)"
        );
        let _ = writeln!(out);
        if self.top_limited.is_empty() {
            let _ = writeln!(out, "no key was limited");
            return out;
        }
        let _ = writeln!(
            out,
            "most limited keys ({} of {} limited)",
            self.top_limited.len(),
            self.limited_keys
        );
        let key_width = self
            .top_limited
            .iter()
            .map(|k| k.key.len() + k.client.as_ref().map_or(0, |c| c.len() + 3))
            .max()
            .unwrap_or(3)
            .max(3);
        let _ = writeln!(
            out,
            "{:<width$}  {:<key_width$}  {:>9}  {:>9}  {:>8}  {:>8}  {:>8}",
            "rule", "key", "offered", "allowed", "denied", "cached", "shadow"
        );
        for k in &self.top_limited {
            let shown = match &k.client {
                Some(client) => format!("{} ({client})", k.key),
                None => k.key.clone(),
            };
            let c = &k.counts;
            let _ = writeln!(
                out,
                "{:<width$}  {:<key_width$}  {:>9}  {:>9}  {:>8}  {:>8}  {:>8}",
                k.rule,
                shown,
                thousands(c.offered),
                thousands(c.allowed),
                dash(c.denied),
                dash(c.cached_deny),
                dash(c.shadow_denied)
            );
        }
        out
    }
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
}
