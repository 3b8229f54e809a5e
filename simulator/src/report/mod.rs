//! What a replay did: per rule and per key, from the filter's own decision records, with each
//! rule's accuracy, a timeline for charts, and what the keys cost Redis.
//!
//! The filter writes what it did with each rule into the request's filter state
//! ([`sluice_core::record`]); the report counts exactly that, so it says what the filter did,
//! not what the simulator guesses it did. Everything in [`Report`] follows from the inputs
//! alone: a virtual-time replay gives the same report, byte for byte, every time. Wall-clock
//! figures (how fast the replay ran, callout latencies in virtual time) are printed, not stored,
//! except in real-time replays, where latency is the point.
//!
//! [`Report::build`] (in `build.rs`) makes it from the [`Recorder`]; [`tables`] makes its tables
//! once; [`text`] and [`html`] render them, the page with
//! [`charts`] beside them.

mod build;
pub mod charts;
pub mod html;
mod markup;
mod recorder;
pub mod tables;
pub mod text;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use sluice_core::lease::LeaseConfig;
use sluice_core::limit::Limit;
use sluice_core::policy::Policy;
use sluice_core::record::RuleOutcome;
use sluice_core::rlqs::{Quota, RlqsConfig};
use sluice_core::rls::RlsConfig;
use sluice_server::config::DEFAULT_KEY_PREFIX;

pub use self::recorder::Recorder;
use crate::accuracy::{Accuracy, RuleLimit};
use crate::trace::timing::Timing;
use crate::trace::{ClientAddresses, Trace};

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
    /// Not counted because another rule denied the request.
    pub skipped: u64,
    /// No answer from the service.
    pub failed: u64,
    /// Admitted after a shaping delay.
    pub delayed: u64,
    /// Decided inside Envoy from a lease (admitted or denied), with no callout.
    pub local: u64,
}

impl Counts {
    fn add(&mut self, outcome: RuleOutcome, delayed: bool, local: bool) {
        self.offered += 1;
        self.local += u64::from(local && decided(outcome).is_some());
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

/// Whether an outcome is the rule's own decision (not skipped, not failed), and if so whether
/// it admitted.
fn decided(outcome: RuleOutcome) -> Option<bool> {
    match outcome {
        RuleOutcome::Allowed => Some(true),
        RuleOutcome::Denied | RuleOutcome::CachedDeny | RuleOutcome::ShadowDenied => Some(false),
        RuleOutcome::Skipped | RuleOutcome::Failed => None,
    }
}

impl RuleReport {
    /// Callouts per 1,000 requests the rule applied to, when both are known.
    pub fn callouts_per_thousand(&self) -> Option<f64> {
        let callouts = self.callouts?;
        (self.counts.offered > 0)
            .then(|| (callouts as f64 * 1000.0 / self.counts.offered as f64 * 10.0).round() / 10.0)
    }
}

/// What the keys of one rule hold in Redis at the end of the replay.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RuleMemory {
    /// Keys.
    pub keys: u64,
    /// Their `MEMORY USAGE`, summed.
    pub bytes: u64,
    /// The largest key's.
    pub max_bytes: u64,
}

impl RuleMemory {
    /// Mean bytes per key.
    pub fn mean_bytes(&self) -> u64 {
        self.bytes.checked_div(self.keys).unwrap_or(0)
    }
}

/// What a leased rule's leases did, from the filter's stats.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LeaseReport {
    /// Asks sent for the rule (each in a lease call, with the asks of other keys).
    pub asks: u64,
    /// Units granted.
    pub units: u64,
    /// Answers with nothing to lease (the algorithm admitted nothing then).
    pub empty: u64,
    /// Asks that got no usable answer.
    pub failures: u64,
    /// The units all Envoys together may hold for one key.
    pub max_outstanding: u64,
}

/// One rule's part of the report.
#[derive(Debug, Clone, Serialize)]
pub struct RuleReport {
    /// The rule.
    pub rule: String,
    /// Its limit, as configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<Limit>,
    /// A shadow rule.
    pub shadow: bool,
    /// Distinct keys seen.
    pub keys: u64,
    /// Its counts.
    #[serde(flatten)]
    pub counts: Counts,
    /// Callouts that carried the rule: its checks sent per request, and its lease asks
    /// (from the filter's stats; absent when they are not known).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub callouts: Option<u64>,
    /// Its leases, for a leased rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseReport>,
    /// How far it strayed from the exact limit and from its own bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<Accuracy>,
    /// Its keys in Redis.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<RuleMemory>,
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

/// Admitted and limited requests per step of time, for one rule or one key.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    /// The rule.
    pub rule: String,
    /// The key, for a key's series.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Admitted requests per step.
    pub allowed: Vec<u64>,
    /// Denied (or shadow-denied) requests per step.
    pub limited: Vec<u64>,
}

/// The replay over time.
#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    /// The first step's start, µs since the epoch.
    pub start_us: i64,
    /// The step, ms: at least the trace's timestamp resolution.
    pub step_ms: u64,
    /// Per rule.
    pub rules: Vec<Series>,
    /// Per most-limited key.
    pub keys: Vec<Series>,
}

/// The trace, as read.
#[derive(Debug, Clone, Serialize)]
pub struct TraceInfo {
    /// Where it came from.
    pub source: String,
    /// Its format.
    pub format: String,
    /// Requests replayed.
    pub requests: u64,
    /// Bad lines skipped.
    pub skipped: usize,
    /// Lines logged out of time order.
    pub reordered: usize,
    /// The first request's time.
    pub first: String,
    /// The last request's time.
    pub last: String,
    /// How precise its timestamps are.
    pub timing: Timing,
}

/// How the replay ran.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "clock", rename_all = "snake_case")]
pub enum Clock {
    /// In virtual time, as fast as the machine goes.
    Virtual {
        /// The modelled time from a callout to its answer.
        callout_latency_ms: u64,
    },
    /// Paced in real time.
    RealTime {
        /// Trace seconds per wall second.
        speed: f64,
    },
}

/// The set-up of the run.
#[derive(Debug, Clone, Serialize)]
pub struct RunInfo {
    /// The policy's file.
    pub policy: String,
    /// Envoy instances sharing the server and Redis.
    pub instances: usize,
    /// Workers per instance.
    pub workers: usize,
    /// The clock.
    #[serde(flatten)]
    pub clock: Clock,
    /// Callouts made.
    pub callouts: u64,
    /// Of which, lease calls (the rest decide requests).
    pub lease_calls: u64,
    /// Requests still open at the end (hung streams).
    pub open_at_end: usize,
    /// What failed during the run (VMs, calls to the service), and why.
    pub failures: Vec<String>,
}

impl RunInfo {
    /// A virtual-time replay through a model of Envoy's own filters, each message answered
    /// `latency` after it left: no VM, no lease, one bucket cache or filter an Envoy.
    pub fn of_native_model(
        name: String,
        instances: usize,
        latency: Duration,
        callouts: u64,
        failures: Vec<String>,
    ) -> RunInfo {
        RunInfo {
            policy: name,
            instances: instances.max(1),
            workers: 1,
            clock: Clock::Virtual {
                callout_latency_ms: latency.as_millis() as u64,
            },
            callouts,
            lease_calls: 0,
            open_at_end: 0,
            failures,
        }
    }
}

/// Callout latencies, measured on the wall clock.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// Callouts measured.
    pub samples: usize,
    /// Median, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Slowest, ms.
    pub max_ms: f64,
}

impl Latency {
    /// Percentiles of `sorted` latencies; `None` when there are none.
    pub fn of(sorted: &[Duration]) -> Option<Latency> {
        let last = sorted.len().checked_sub(1)?;
        let at = |q: f64| {
            let d = sorted[((last as f64) * q).round() as usize];
            (d.as_secs_f64() * 1e6).round() / 1e3
        };
        Some(Latency {
            samples: sorted.len(),
            p50_ms: at(0.5),
            p90_ms: at(0.9),
            p99_ms: at(0.99),
            max_ms: at(1.0),
        })
    }
}

/// Everything a replay found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The trace.
    pub trace: TraceInfo,
    /// The run.
    pub run: RunInfo,
    /// Responses by status.
    pub responses: BTreeMap<u16, u64>,
    /// Requests no rule applied to.
    pub unmatched: u64,
    /// Decision records the simulator could not read (a filter bug if ever non-zero).
    pub unreadable_records: u64,
    /// Per rule.
    pub rules: Vec<RuleReport>,
    /// Keys limited at least once.
    pub limited_keys: u64,
    /// The most limited keys.
    pub top_limited: Vec<KeyReport>,
    /// Over time.
    pub timeline: Timeline,
    /// Callout latency (real-time replays).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency: Option<Latency>,
    /// Why Redis memory was not measured, if it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_note: Option<String>,
    /// The prefix of the keys measured, when it is not the server's default (a replay in a
    /// Redis the user gave names its keys apart, so their names are longer than production's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_key_prefix: Option<String>,
}

/// A rule the configuration names: its limit, for accuracy, and its place in the report.
#[derive(Debug, Clone)]
pub struct KnownRule {
    /// The rule's name, as the decisions record it.
    pub name: String,
    /// Its limit as accuracy judges it; `None` when it has none (unlimited).
    pub limit: Option<RuleLimit>,
    /// Decided and counted, never enforced.
    pub shadow: bool,
    /// Its leases, for a leased rule.
    pub lease: Option<LeaseConfig>,
}

impl KnownRule {
    /// The rules of a filter policy.
    pub fn of_policy(policy: &Policy) -> Vec<KnownRule> {
        policy
            .rules
            .iter()
            .map(|r| KnownRule {
                name: r.name.to_string(),
                limit: Some(RuleLimit {
                    limit: r.limit,
                    cost: r.cost,
                    count_denied: r.count_denied,
                    lease_allowance: r.lease.map_or(0, |l| l.terms.max_outstanding),
                }),
                shadow: r.shadow,
                lease: r.lease,
            })
            .collect()
    }

    /// The rules of a rate limit service configuration, named as their descriptors' paths.
    pub fn of_rls(config: &RlsConfig) -> Vec<KnownRule> {
        config
            .rules()
            .iter()
            .map(|r| KnownRule {
                name: r.rule_name.to_string(),
                // sluice-server decides all or nothing: a denied hit consumes nothing.
                limit: r.limit.map(|limit| RuleLimit {
                    limit,
                    cost: 1,
                    count_denied: false,
                    lease_allowance: 0,
                }),
                shadow: r.shadow_mode,
                lease: None,
            })
            .collect()
    }
}

impl KnownRule {
    /// The rules of a quota service configuration, each domain's default among them.
    pub fn of_rlqs(config: &RlqsConfig) -> Vec<KnownRule> {
        config
            .domains()
            .flat_map(|(_, domain)| domain.rules.iter().chain(std::iter::once(&domain.default)))
            .map(|rule| KnownRule {
                name: rule.name.to_string(),
                limit: match rule.quota {
                    Quota::Limit(limit) => Some(RuleLimit {
                        limit,
                        cost: 1,
                        count_denied: false,
                        lease_allowance: 0,
                    }),
                    Quota::AllowAll | Quota::DenyAll => None,
                },
                shadow: false,
                lease: None,
            })
            .collect()
    }
}

/// What a report is built from besides the recorder.
pub struct Inputs<'a> {
    /// The trace replayed.
    pub trace: &'a Trace,
    /// The run's set-up.
    pub run: RunInfo,
    /// The rules the configuration names, in its order, with their limits.
    pub rules: &'a [KnownRule],
    /// How many of the most limited keys to list.
    pub top: usize,
    /// Names behind synthetic client addresses.
    pub clients: &'a ClientAddresses,
    /// The filter's stats, summed over the Envoys, by name (without `wasmcustom.`).
    pub stats: &'a BTreeMap<String, i64>,
}

impl Report {
    /// Fills in each rule's Redis memory, measured on keys named under `prefix`.
    pub fn set_memory(&mut self, mut by_rule: BTreeMap<String, RuleMemory>, prefix: &str) {
        for rule in &mut self.rules {
            rule.memory = Some(by_rule.remove(&rule.rule).unwrap_or_default());
        }
        self.memory_key_prefix = (prefix != DEFAULT_KEY_PREFIX).then(|| prefix.to_owned());
    }

    /// Says why Redis memory is unknown.
    pub fn memory_unknown(&mut self, why: String) {
        self.memory_note = Some(why);
    }

    /// How the measured keys' names differ from production's, when they do.
    pub fn memory_caveat(&self) -> Option<String> {
        let prefix = self.memory_key_prefix.as_ref()?;
        let longer = prefix.len() as i64 - DEFAULT_KEY_PREFIX.len() as i64;
        Some(format!(
            "these keys are named under this run's prefix \"{prefix}\", {} bytes {} than under \
             the server's default \"{DEFAULT_KEY_PREFIX}\"; production's keys take about that much {} each",
            longer.unsigned_abs(),
            if longer >= 0 { "longer" } else { "shorter" },
            if longer >= 0 { "less" } else { "more" },
        ))
    }
}
