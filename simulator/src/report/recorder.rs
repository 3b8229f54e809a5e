//! Collects what the filter recorded for each completed request, compactly: a replay of a
//! million requests keeps a few tens of bytes per rule decision.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use sluice_core::record::{self, DECISION_PROPERTY, RuleOutcome, RuleRecord};

use sluice_host::envoy::Completed;

/// One rule's decision for one request.
#[derive(Debug, Clone, Copy)]
pub(super) struct Decision {
    pub key: u32,
    pub outcome: RuleOutcome,
    pub delay_ms: u32,
    pub time_us: i64,
    pub instance: u16,
    /// Decided in Envoy from a lease.
    pub local: bool,
}

/// Everything a report is built from.
#[derive(Default)]
pub struct Recorder {
    pub(super) requests: u64,
    pub(super) statuses: BTreeMap<u16, u64>,
    pub(super) unmatched: u64,
    pub(super) unreadable_records: u64,
    /// Rule names, in the order first seen.
    pub(super) rules: Vec<String>,
    rule_index: HashMap<String, usize>,
    /// Per rule, its keys' ids.
    key_index: Vec<HashMap<String, u32>>,
    /// Each key's rule and text, by id.
    pub(super) keys: Vec<(usize, String)>,
    pub(super) decisions: Vec<Decision>,
    pub(super) latencies: Vec<Duration>,
    pub(super) first_us: Option<i64>,
    pub(super) last_us: i64,
}

impl Recorder {
    /// Counts one completed request, taken by Envoy `instance`.
    pub fn add(&mut self, instance: usize, done: &Completed) {
        let time_us = (done.started_ns / 1000) as i64;
        let Some((_, bytes)) = done
            .filter_state
            .iter()
            .find(|(k, _)| k.strip_prefix(b"wasm.") == Some(DECISION_PROPERTY.as_bytes()))
        else {
            self.add_decided(instance, done.status, time_us, &[]);
            return;
        };
        match record::decode(bytes) {
            Ok(lines) => self.add_decided(instance, done.status, time_us, &lines),
            Err(_) => {
                self.count_request(done.status, time_us);
                self.unreadable_records += 1;
            }
        }
    }

    /// Counts one request that Envoy `instance` answered with `status`, which arrived at
    /// `time_us` and was decided by the rules of `lines` (none: no rule matched it).
    pub fn add_decided(
        &mut self,
        instance: usize,
        status: u16,
        time_us: i64,
        lines: &[RuleRecord],
    ) {
        self.count_request(status, time_us);
        if lines.is_empty() {
            self.unmatched += 1;
        }
        for line in lines {
            let rule = self.rule_id(line.rule.as_str());
            let key = self.key_id(rule, &line.key);
            self.decisions.push(Decision {
                key,
                outcome: line.outcome,
                delay_ms: u32::try_from(line.delay_ms).unwrap_or(u32::MAX),
                time_us,
                instance: u16::try_from(instance).unwrap_or(u16::MAX),
                local: line.local,
            });
        }
    }

    fn count_request(&mut self, status: u16, time_us: i64) {
        self.requests += 1;
        *self.statuses.entry(status).or_default() += 1;
        self.first_us = Some(self.first_us.map_or(time_us, |f| f.min(time_us)));
        self.last_us = self.last_us.max(time_us);
    }

    /// Records a callout's wall-clock latency.
    pub fn callout(&mut self, latency: Duration) {
        self.latencies.push(latency);
    }

    fn rule_id(&mut self, rule: &str) -> usize {
        if let Some(&id) = self.rule_index.get(rule) {
            return id;
        }
        let id = self.rules.len();
        self.rules.push(rule.to_owned());
        self.rule_index.insert(rule.to_owned(), id);
        self.key_index.push(HashMap::new());
        id
    }

    fn key_id(&mut self, rule: usize, key: &str) -> u32 {
        if let Some(&id) = self.key_index[rule].get(key) {
            return id;
        }
        let id = self.keys.len() as u32;
        self.keys.push((rule, key.to_owned()));
        self.key_index[rule].insert(key.to_owned(), id);
        id
    }

    /// When `rule` admitted requests for `key` (shaped ones when they were let go), in order.
    pub fn admitted_times(&self, rule: &str, key: &str) -> Vec<i64> {
        let Some(id) = self
            .rule_index
            .get(rule)
            .and_then(|&r| self.key_index[r].get(key))
        else {
            return Vec::new();
        };
        let mut times: Vec<i64> = self
            .decisions
            .iter()
            .filter(|d| d.key == *id && d.outcome == RuleOutcome::Allowed)
            .map(|d| d.time_us + i64::from(d.delay_ms) * 1000)
            .collect();
        times.sort_unstable();
        times
    }

    /// Callout latencies seen so far, sorted.
    pub fn sorted_latencies(&self) -> Vec<Duration> {
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        sorted
    }
}
