//! Building a [`Report`] from what the [`Recorder`] kept: each rule's and key's counts, each
//! rule's accuracy from its keys' offers in time order, the most limited keys, the timeline.

use sluice_core::record::RuleOutcome;
use sluice_core::stat_names::{RuleStat, rule_stat};

use super::{
    Clock, Counts, Inputs, KeyReport, Latency, LeaseReport, Recorder, Report, RuleReport, Series,
    Timeline, TraceInfo, decided,
};
use crate::accuracy::{self, Offer};
use crate::trace::timing::Timing;
use crate::trace::{Trace, format_time};

/// Time steps a timeline may use; the smallest one that gives at most [`MAX_STEPS`] steps and
/// is no finer than the trace's timestamps wins.
const STEPS_MS: [u64; 11] = [
    1_000, 5_000, 10_000, 30_000, 60_000, 300_000, 600_000, 1_800_000, 3_600_000, 21_600_000,
    86_400_000,
];
const MAX_STEPS: u64 = 720;

/// Keys charted on their own.
const CHARTED_KEYS: usize = 5;

/// The recorder's decisions counted by rule and by key, and each rule's offers by key.
struct Tally<'r> {
    /// By the recorder's key id.
    by_key: Vec<Counts>,
    /// By the recorder's rule id.
    by_rule: Vec<Counts>,
    /// By the recorder's rule id: each key's requests in time order.
    offers: Vec<Vec<(&'r str, Vec<Offer>)>>,
}

impl Report {
    /// Builds the report of a finished replay.
    pub fn build(recorder: &Recorder, inputs: Inputs<'_>) -> Report {
        let tally = tally(recorder);
        let rules = rule_reports(recorder, &inputs, &tally);
        let (limited_keys, top_limited) = most_limited(recorder, &inputs, &tally.by_key);
        let charted: Vec<u32> = top_limited
            .iter()
            .take(CHARTED_KEYS)
            .map(|(id, _)| *id)
            .collect();
        let timeline = timeline(recorder, &inputs.trace.timing, &charted);
        let latency = match inputs.run.clock {
            Clock::RealTime { .. } => Latency::of(&recorder.sorted_latencies()),
            Clock::Virtual { .. } => None,
        };
        Report {
            trace: trace_info(recorder, inputs.trace),
            run: inputs.run,
            responses: recorder.statuses.clone(),
            unmatched: recorder.unmatched,
            unreadable_records: recorder.unreadable_records,
            rules,
            limited_keys,
            top_limited: top_limited.into_iter().map(|(_, k)| k).collect(),
            timeline,
            latency,
            memory_note: None,
            memory_key_prefix: None,
        }
    }
}

fn tally(recorder: &Recorder) -> Tally<'_> {
    let mut by_key = vec![Counts::default(); recorder.keys.len()];
    let mut by_rule = vec![Counts::default(); recorder.rules.len()];
    for d in &recorder.decisions {
        let delayed = d.outcome == RuleOutcome::Allowed && d.delay_ms > 0;
        by_key[d.key as usize].add(d.outcome, delayed, d.local);
        by_rule[recorder.keys[d.key as usize].0].add(d.outcome, delayed, d.local);
    }
    // Each key's decisions, in time order.
    let mut order: Vec<u32> = (0..recorder.decisions.len() as u32).collect();
    order.sort_by_key(|&i| {
        let d = &recorder.decisions[i as usize];
        (d.key, d.time_us)
    });
    let mut offers: Vec<Vec<(&str, Vec<Offer>)>> = vec![Vec::new(); recorder.rules.len()];
    for chunk in order
        .chunk_by(|a, b| recorder.decisions[*a as usize].key == recorder.decisions[*b as usize].key)
    {
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
    Tally {
        by_key,
        by_rule,
        offers,
    }
}

/// A report per rule: the policy's rules in its order, then any the policy does not name.
fn rule_reports(recorder: &Recorder, inputs: &Inputs<'_>, tally: &Tally<'_>) -> Vec<RuleReport> {
    let stat = |rule: &str, stat: RuleStat| -> Option<u64> {
        let value = inputs.stats.get(&rule_stat(rule, stat))?;
        u64::try_from(*value).ok()
    };
    let mut names: Vec<String> = inputs.rules.iter().map(|r| r.name.clone()).collect();
    for rule in &recorder.rules {
        if !names.contains(rule) {
            names.push(rule.clone());
        }
    }
    names
        .iter()
        .map(|name| {
            let id = recorder.rules.iter().position(|r| r == name);
            let known = inputs.rules.iter().find(|r| r.name == *name);
            let accuracy = match (id, known.and_then(|k| k.limit.as_ref())) {
                (Some(id), Some(limit)) => Some(accuracy::assess(
                    limit,
                    inputs.run.instances,
                    tally.offers[id].iter().map(|(k, o)| (*k, o.as_slice())),
                )),
                _ => None,
            };
            let leased = known.and_then(|k| k.lease);
            let lease = leased.map(|config| LeaseReport {
                asks: stat(name, RuleStat::LeaseAsks).unwrap_or(0)
                    + stat(name, RuleStat::LeaseFailures).unwrap_or(0),
                units: stat(name, RuleStat::LeaseUnits).unwrap_or(0),
                empty: stat(name, RuleStat::LeaseEmpty).unwrap_or(0),
                failures: stat(name, RuleStat::LeaseFailures).unwrap_or(0),
                max_outstanding: config.terms.max_outstanding,
            });
            let callouts =
                stat(name, RuleStat::Callouts).map(|c| c + lease.as_ref().map_or(0, |l| l.asks));
            RuleReport {
                rule: name.clone(),
                limit: known.and_then(|k| k.limit.as_ref()).map(|l| l.limit),
                shadow: known.is_some_and(|k| k.shadow),
                keys: id.map_or(0, |id| tally.offers[id].len() as u64),
                counts: id.map(|id| tally.by_rule[id].clone()).unwrap_or_default(),
                callouts,
                lease,
                accuracy,
                memory: None,
            }
        })
        .collect()
}

/// How many keys were limited at all, and the `inputs.top` most limited with their key ids.
fn most_limited(
    recorder: &Recorder,
    inputs: &Inputs<'_>,
    by_key: &[Counts],
) -> (u64, Vec<(u32, KeyReport)>) {
    let mut limited: Vec<(u32, KeyReport)> = by_key
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
    (limited_keys, limited)
}

fn trace_info(recorder: &Recorder, trace: &Trace) -> TraceInfo {
    let first = trace.records.first().map_or(0, |r| r.time_us);
    let last = trace.records.last().map_or(0, |r| r.time_us);
    TraceInfo {
        source: trace.source.clone(),
        format: trace
            .format
            .map_or_else(|| "generated".to_owned(), |f| f.to_string()),
        requests: recorder.requests,
        skipped: trace.skipped,
        reordered: trace.reordered,
        first: format_time(first),
        last: format_time(last),
        timing: trace.timing.clone(),
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
