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
//! [`tables`] makes the report's tables once; [`text`] and [`html`] render them, the page with
//! [`charts`] beside them.

pub mod charts;
pub mod html;
mod markup;
mod recorder;
pub mod tables;
pub mod text;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use sluice_core::limit::Limit;
use sluice_core::policy::Policy;
use sluice_core::record::RuleOutcome;
use sluice_core::stat_names::{RuleStat, rule_stat};
use sluice_server::config::DEFAULT_KEY_PREFIX;

pub use self::recorder::Recorder;
use crate::accuracy::{self, Accuracy, Offer, RuleLimit};
use crate::trace::timing::Timing;
use crate::trace::{ClientAddresses, Trace, format_time};

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
    /// VMs that failed, and why.
    pub vm_failures: Vec<String>,
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

/// What a report is built from besides the recorder.
pub struct Inputs<'a> {
    /// The trace replayed.
    pub trace: &'a Trace,
    /// The run's set-up.
    pub run: RunInfo,
    /// The policy, to know each rule's limit.
    pub policy: Option<&'a Policy>,
    /// How many of the most limited keys to list.
    pub top: usize,
    /// Names behind synthetic client addresses.
    pub clients: &'a ClientAddresses,
    /// The filter's stats, summed over the Envoys, by name (without `wasmcustom.`).
    pub stats: &'a BTreeMap<String, i64>,
}

/// Time steps a timeline may use; the smallest one that gives at most [`MAX_STEPS`] steps and
/// is no finer than the trace's timestamps wins.
const STEPS_MS: [u64; 11] = [
    1_000, 5_000, 10_000, 30_000, 60_000, 300_000, 600_000, 1_800_000, 3_600_000, 21_600_000,
    86_400_000,
];
const MAX_STEPS: u64 = 720;

/// Keys charted on their own.
const CHARTED_KEYS: usize = 5;

impl Report {
    /// Builds the report of a finished replay.
    pub fn build(recorder: &Recorder, inputs: Inputs<'_>) -> Report {
        let rule_limits: BTreeMap<&str, (RuleLimit, bool)> = inputs
            .policy
            .map(|p| {
                p.rules
                    .iter()
                    .map(|r| {
                        (
                            r.name.as_str(),
                            (
                                RuleLimit {
                                    limit: r.limit,
                                    cost: r.cost,
                                    count_denied: r.count_denied,
                                    lease_allowance: r.lease.map_or(0, |l| l.terms.max_outstanding),
                                },
                                r.shadow,
                            ),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let stat = |rule: &str, stat: RuleStat| -> Option<u64> {
            let value = inputs.stats.get(&rule_stat(rule, stat))?;
            u64::try_from(*value).ok()
        };
        // Each key's decisions, in time order.
        let mut order: Vec<u32> = (0..recorder.decisions.len() as u32).collect();
        order.sort_by_key(|&i| {
            let d = &recorder.decisions[i as usize];
            (d.key, d.time_us)
        });
        let mut key_counts = vec![Counts::default(); recorder.keys.len()];
        let mut rule_counts = vec![Counts::default(); recorder.rules.len()];
        for d in &recorder.decisions {
            let delayed = d.outcome == RuleOutcome::Allowed && d.delay_ms > 0;
            key_counts[d.key as usize].add(d.outcome, delayed, d.local);
            rule_counts[recorder.keys[d.key as usize].0].add(d.outcome, delayed, d.local);
        }
        let mut offers: Vec<Vec<(&str, Vec<Offer>)>> = vec![Vec::new(); recorder.rules.len()];
        for chunk in order.chunk_by(|a, b| {
            recorder.decisions[*a as usize].key == recorder.decisions[*b as usize].key
        }) {
            let key = recorder.decisions[chunk[0] as usize].key as usize;
            let (rule, text) = &recorder.keys[key];
            let list = chunk
                .iter()
                .map(|&i| &recorder.decisions[i as usize])
                .filter_map(|d| {
                    Some(Offer {
                        time_us: d.time_us,
                        admitted: decided(d.outcome)?,
                        delay_ms: u64::from(d.delay_ms),
                        instance: usize::from(d.instance),
                    })
                })
                .collect();
            offers[*rule].push((text.as_str(), list));
        }

        // Rules in the policy's order, then any the policy does not name.
        let mut names: Vec<String> = inputs
            .policy
            .map(|p| p.rules.iter().map(|r| r.name.to_string()).collect())
            .unwrap_or_default();
        for rule in &recorder.rules {
            if !names.contains(rule) {
                names.push(rule.clone());
            }
        }
        let rules = names
            .iter()
            .map(|name| {
                let id = recorder.rules.iter().position(|r| r == name);
                let known = rule_limits.get(name.as_str());
                let accuracy = match (id, known) {
                    (Some(id), Some((limit, _))) => Some(accuracy::assess(
                        limit,
                        inputs.run.instances,
                        offers[id].iter().map(|(k, o)| (*k, o.as_slice())),
                    )),
                    _ => None,
                };
                let leased = inputs
                    .policy
                    .and_then(|p| p.rules.iter().find(|r| r.name.as_str() == name))
                    .and_then(|r| r.lease);
                let lease = leased.map(|config| LeaseReport {
                    asks: stat(name, RuleStat::LeaseAsks).unwrap_or(0)
                        + stat(name, RuleStat::LeaseFailures).unwrap_or(0),
                    units: stat(name, RuleStat::LeaseUnits).unwrap_or(0),
                    empty: stat(name, RuleStat::LeaseEmpty).unwrap_or(0),
                    failures: stat(name, RuleStat::LeaseFailures).unwrap_or(0),
                    max_outstanding: config.terms.max_outstanding,
                });
                let callouts = stat(name, RuleStat::Callouts)
                    .map(|c| c + lease.as_ref().map_or(0, |l| l.asks));
                RuleReport {
                    rule: name.clone(),
                    limit: known.map(|(l, _)| l.limit),
                    shadow: known.is_some_and(|(_, shadow)| *shadow),
                    keys: id.map_or(0, |id| offers[id].len() as u64),
                    counts: id.map(|id| rule_counts[id].clone()).unwrap_or_default(),
                    callouts,
                    lease,
                    accuracy,
                    memory: None,
                }
            })
            .collect();

        let mut limited: Vec<(u32, KeyReport)> = key_counts
            .iter()
            .enumerate()
            .filter(|(_, c)| c.limited() > 0)
            .map(|(id, counts)| {
                let (rule, key) = &recorder.keys[id];
                (
                    id as u32,
                    KeyReport {
                        rule: recorder.rules[*rule].clone(),
                        key: key.clone(),
                        client: inputs.clients.name_of(key).map(str::to_owned),
                        counts: counts.clone(),
                    },
                )
            })
            .collect();
        limited.sort_by(|(_, a), (_, b)| {
            b.counts
                .limited()
                .cmp(&a.counts.limited())
                .then(b.counts.offered.cmp(&a.counts.offered))
                .then(a.rule.cmp(&b.rule))
                .then(a.key.cmp(&b.key))
        });
        let limited_keys = limited.len() as u64;
        limited.truncate(inputs.top);
        let charted: Vec<u32> = limited
            .iter()
            .take(CHARTED_KEYS)
            .map(|(id, _)| *id)
            .collect();
        let timeline = timeline(recorder, &inputs.trace.timing, &charted);

        let first = inputs.trace.records.first().map_or(0, |r| r.time_us);
        let last = inputs.trace.records.last().map_or(0, |r| r.time_us);
        let latency = match inputs.run.clock {
            Clock::RealTime { .. } => Latency::of(&recorder.sorted_latencies()),
            Clock::Virtual { .. } => None,
        };
        Report {
            trace: TraceInfo {
                source: inputs.trace.source.clone(),
                format: inputs
                    .trace
                    .format
                    .map_or_else(|| "generated".to_owned(), |f| f.to_string()),
                requests: recorder.requests,
                skipped: inputs.trace.skipped,
                reordered: inputs.trace.reordered,
                first: format_time(first),
                last: format_time(last),
                timing: inputs.trace.timing.clone(),
            },
            run: inputs.run,
            responses: recorder.statuses.clone(),
            unmatched: recorder.unmatched,
            unreadable_records: recorder.unreadable_records,
            rules,
            limited_keys,
            top_limited: limited.into_iter().map(|(_, k)| k).collect(),
            timeline,
            latency,
            memory_note: None,
            memory_key_prefix: None,
        }
    }

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

    /// The terminal report.
    pub fn render(&self) -> String {
        text::render(self)
    }
}

fn timeline(recorder: &Recorder, timing: &Timing, charted: &[u32]) -> Timeline {
    let first = recorder.first_us.unwrap_or(0);
    let span_ms = (recorder.last_us - first).max(0) as u64 / 1000 + 1;
    let finest = (timing.resolution.micros() / 1000).max(1) as u64;
    let step_ms = STEPS_MS
        .iter()
        .copied()
        .find(|&s| s >= finest && span_ms.div_ceil(s) <= MAX_STEPS)
        .unwrap_or(STEPS_MS[STEPS_MS.len() - 1]);
    // Steps align to the step (whole seconds, minutes, hours) so charts read naturally.
    let step_us = step_ms as i64 * 1000;
    let start_us = first.div_euclid(step_us) * step_us;
    let steps = ((recorder.last_us - start_us) / step_us + 1).max(1) as usize;
    let empty = |rule: &str, key: Option<&str>| Series {
        rule: rule.to_owned(),
        key: key.map(str::to_owned),
        allowed: vec![0; steps],
        limited: vec![0; steps],
    };
    let mut rules: Vec<Series> = recorder.rules.iter().map(|r| empty(r, None)).collect();
    let mut keys: Vec<Series> = charted
        .iter()
        .map(|&id| {
            let (rule, key) = &recorder.keys[id as usize];
            empty(&recorder.rules[*rule], Some(key))
        })
        .collect();
    for d in &recorder.decisions {
        let Some(admitted) = decided(d.outcome) else {
            continue;
        };
        let step = ((d.time_us - start_us) / step_us) as usize;
        let bump = |series: &mut Series| {
            if admitted {
                series.allowed[step] += 1;
            } else {
                series.limited[step] += 1;
            }
        };
        bump(&mut rules[recorder.keys[d.key as usize].0]);
        if let Some(i) = charted.iter().position(|&k| k == d.key) {
            bump(&mut keys[i]);
        }
    }
    Timeline {
        start_us,
        step_ms,
        rules,
        keys,
    }
}
