//! What the filter did with each rule for one request, written where access logs can read it.
//!
//! The filter stores the record as the request's filter state `sluice.decision` (Envoy keeps
//! it as `wasm.sluice.decision`, so an access log can print it with
//! `%FILTER_STATE(wasm.sluice.decision:PLAIN)%`). The simulator reads the same record to
//! report per rule and per key what the filter did: it reports what the filter says, never
//! what it guesses.

use std::borrow::Borrow;

use serde::{Deserialize, Serialize};

use crate::decimal;
use crate::key::RuleName;
use crate::wire::write_json_string;

/// The filter-state name of the record.
pub const DECISION_PROPERTY: &str = "sluice.decision";

/// What happened to one matching rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleOutcome {
    /// The rule admitted the request.
    Allowed,
    /// The rule denied it.
    Denied,
    /// A shadow rule that would have denied it.
    ShadowDenied,
    /// Denied from the local deny cache, without a callout.
    CachedDeny,
    /// Another rule denied the request, so this one, which would have admitted it, consumed
    /// nothing.
    Skipped,
    /// The service did not answer; the failure mode decided.
    Failed,
}

/// One rule's line of the record; the filter writes it from borrowed names and keys
/// (`R = &RuleName`, `K = &str`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleRecord<R = RuleName, K = String> {
    /// The rule.
    pub rule: R,
    /// The escaped key.
    pub key: K,
    /// What happened.
    pub outcome: RuleOutcome,
    /// Milliseconds the request was held (shaping).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub delay_ms: u64,
    /// Decided inside Envoy from a lease, with no callout for this rule.
    #[serde(default, skip_serializing_if = "is_false")]
    pub local: bool,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The whole record: one line per rule that matched.
pub type DecisionRecord = Vec<RuleRecord>;

/// What each check of one request came to, given the server's verdicts in check order and
/// whether each check is a shadow one. This is the protocol's rule (see
/// [`crate::algorithm::decide_all`]): a request that an enforced check denies consumes nothing,
/// so the checks that would have admitted it are [`Skipped`].
///
/// [`Skipped`]: RuleOutcome::Skipped
pub fn outcomes(checks: impl IntoIterator<Item = (bool, bool)>) -> Vec<RuleOutcome> {
    let checks: Vec<(bool, bool)> = checks.into_iter().collect();
    let denied = request_denied(checks.iter().copied());
    checks
        .into_iter()
        .map(|(shadow, allowed)| outcome(shadow, allowed, denied))
        .collect()
}

/// Whether any enforced check denied the request, given `(shadow, allowed)` per check.
pub fn request_denied(mut checks: impl Iterator<Item = (bool, bool)>) -> bool {
    checks.any(|(shadow, allowed)| !shadow && !allowed)
}

/// What one check came to (see [`outcomes`]), given whether the request was denied.
pub fn outcome(shadow: bool, allowed: bool, request_denied: bool) -> RuleOutcome {
    match (allowed, shadow) {
        (true, _) if request_denied => RuleOutcome::Skipped,
        (true, _) => RuleOutcome::Allowed,
        (false, true) => RuleOutcome::ShadowDenied,
        (false, false) => RuleOutcome::Denied,
    }
}

/// `$text!` of each outcome's name, for `$outcome`: the names are written here once, and
/// every text made of one (the record's field, a line's end) is made at compile time.
macro_rules! per_outcome {
    ($outcome:expr, $text:ident) => {
        match $outcome {
            RuleOutcome::Allowed => $text!("allowed"),
            RuleOutcome::Denied => $text!("denied"),
            RuleOutcome::ShadowDenied => $text!("shadow_denied"),
            RuleOutcome::CachedDeny => $text!("cached_deny"),
            RuleOutcome::Skipped => $text!("skipped"),
            RuleOutcome::Failed => $text!("failed"),
        }
    };
}

macro_rules! name {
    ($name:literal) => {
        $name
    };
}

macro_rules! field {
    ($name:literal) => {
        concat!(r#","outcome":""#, $name, r#"""#)
    };
}

macro_rules! line_end {
    ($name:literal) => {
        concat!(r#","outcome":""#, $name, r#""}"#)
    };
}

macro_rules! local_line_end {
    ($name:literal) => {
        concat!(r#","outcome":""#, $name, r#"","local":true}"#)
    };
}

impl RuleOutcome {
    /// The record's `outcome` field, its comma before it: [`RuleOutcome::name`] in JSON.
    fn field(self) -> &'static [u8] {
        per_outcome!(self, field).as_bytes()
    }

    /// The end of a record line with this outcome and no delay: [`RuleOutcome::field`] and
    /// the `local` field when decided here, written whole, as a line ends for nearly every
    /// request.
    fn line_end(self, local: bool) -> &'static [u8] {
        if local {
            per_outcome!(self, local_line_end).as_bytes()
        } else {
            per_outcome!(self, line_end).as_bytes()
        }
    }

    /// The outcome's name, as in the record and in metrics labels.
    pub fn name(self) -> &'static str {
        per_outcome!(self, name)
    }
}

/// Encodes a record as compact JSON: the bytes serde writes for it (the tests hold them
/// equal), without serde's machinery. The filter writes its record with [`RecordWriter`],
/// line by line, into a buffer it keeps.
pub fn encode<R: Borrow<RuleName>, K: AsRef<str>>(
    record: impl IntoIterator<Item = RuleRecord<R, K>>,
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut writer = RecordWriter::new(&mut out);
    for line in record {
        writer.line(
            line.rule.borrow(),
            line.key.as_ref(),
            line.outcome,
            line.delay_ms,
            line.local,
        );
    }
    writer.finish();
    out
}

/// A record written line by line into a buffer the filter keeps, emptied first, so that a
/// record costs no allocation: what [`encode`] writes, for a filter that works out each line
/// as it goes.
pub struct RecordWriter<'a> {
    out: &'a mut Vec<u8>,
    lines: usize,
}

impl<'a> RecordWriter<'a> {
    /// A record to write in `out`.
    #[inline]
    pub fn new(out: &'a mut Vec<u8>) -> RecordWriter<'a> {
        out.clear();
        out.push(b'[');
        RecordWriter { out, lines: 0 }
    }

    /// Writes the line of one check: its rule, its escaped key, what came of it, how long it
    /// was held, whether it was decided here.
    pub fn line(
        &mut self,
        rule: &RuleName,
        key: &str,
        outcome: RuleOutcome,
        delay_ms: u64,
        local: bool,
    ) {
        let out = &mut *self.out;
        out.reserve(80 + key.len());
        if self.lines > 0 {
            out.push(b',');
        }
        self.lines += 1;
        out.extend_from_slice(br#"{"rule":""#);
        // A rule name is `A-Z a-z 0-9 _ . -`: nothing in it needs escaping, so it is not
        // scanned for what would (two scans of the three strings a line writes).
        out.extend_from_slice(rule.as_str().as_bytes());
        out.extend_from_slice(br#"","key":"#);
        write_json_string(out, key);
        if delay_ms == 0 {
            out.extend_from_slice(outcome.line_end(local));
            return;
        }
        out.extend_from_slice(outcome.field());
        out.extend_from_slice(br#","delay_ms":"#);
        decimal::write(out, delay_ms);
        out.extend_from_slice(if local {
            br#","local":true}"#.as_slice()
        } else {
            b"}"
        });
    }

    /// The record, whole.
    #[inline]
    pub fn finish(self) -> &'a [u8] {
        self.out.push(b']');
        self.out
    }
}

/// Decodes a record.
pub fn decode(bytes: &[u8]) -> Result<DecisionRecord, serde_json::Error> {
    serde_json::from_slice(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_admitting_check_of_a_denied_request_is_skipped() {
        use RuleOutcome::*;
        let got = outcomes([
            (false, true),
            (true, false),
            (false, false),
            (false, true),
            (true, true),
            (false, false),
        ]);
        assert_eq!(
            got,
            [Skipped, ShadowDenied, Denied, Skipped, Skipped, Denied]
        );
        let got = outcomes([(false, true), (true, false), (true, true)]);
        assert_eq!(got, [Allowed, ShadowDenied, Allowed]);
    }

    #[test]
    fn every_outcome_is_written_as_serde_writes_it_local_or_not_held_or_not() {
        use RuleOutcome::*;
        let mut lines = Vec::new();
        for outcome in [Allowed, Denied, ShadowDenied, CachedDeny, Skipped, Failed] {
            let name = serde_json::to_string(&outcome).unwrap();
            assert_eq!(name.trim_matches('"'), outcome.name());
            for local in [false, true] {
                for delay_ms in [0, 7] {
                    lines.push(RuleRecord {
                        rule: RuleName::new("r").unwrap(),
                        key: "k".to_owned(),
                        outcome,
                        delay_ms,
                        local,
                    });
                }
            }
        }
        for line in &lines {
            let one = std::slice::from_ref(line);
            assert_eq!(
                String::from_utf8(encode(one.iter().cloned())).unwrap(),
                serde_json::to_string(one).unwrap()
            );
        }
        assert_eq!(decode(&encode(lines.iter().cloned())).unwrap(), lines);
    }

    #[test]
    fn records_round_trip() {
        let record = vec![
            RuleRecord {
                rule: RuleName::new("per-ip").unwrap(),
                key: "1.2.3.4".into(),
                outcome: RuleOutcome::Denied,
                delay_ms: 0,
                local: false,
            },
            RuleRecord {
                rule: RuleName::new("shape").unwrap(),
                key: r#"k"\"#.into(),
                outcome: RuleOutcome::Allowed,
                delay_ms: 40,
                local: true,
            },
        ];
        let bytes = encode(record.iter().cloned());
        assert_eq!(bytes, serde_json::to_vec(&record).unwrap());
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"[{"rule":"per-ip","key":"1.2.3.4","outcome":"denied"},{"rule":"shape","key":"k\"\\","outcome":"allowed","delay_ms":40,"local":true}]"#
        );
        assert_eq!(decode(&bytes).unwrap(), record);
    }
}
