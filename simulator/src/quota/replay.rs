//! A trace through N modelled Envoys' quota filters, in virtual time, against the real quota
//! service in this process ([`ReplayStream`]): each Envoy's stream opens at its first bucket,
//! its reports go every 5 s and at each new bucket, the service steps once a second, and what
//! the service sends arrives a modelled latency later.

use std::net::IpAddr;
use std::time::Duration;

use sluice_core::key::RuleName;
use sluice_core::record::{RuleOutcome, RuleRecord};
use sluice_core::rlqs::{BucketId, RlqsConfig};
use sluice_server::envoy_api::quota::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use sluice_server::in_process::InProcessServer;
use sluice_server::rlqs::replay::ReplayStream;

use super::config::QuotaConfig;
use super::envoy::{QuotaEnvoy, REPORT_EVERY_US};
use crate::decided::Decided;
use crate::native::replay::request_headers;
use crate::replay::EventQueue;
use crate::trace::{ClientAddresses, TraceRecord};

/// How often the service steps a stream (its funding tick).
const STEP_EVERY_US: i64 = 1_000_000;

/// What the replay is run through.
pub struct QuotaSetup<'a> {
    /// The filter's configuration.
    pub config: &'a QuotaConfig,
    /// The service's, to name each bucket's rule as the service does.
    pub limits: &'a RlqsConfig,
    /// Envoys taking the trace round robin, each with its own stream.
    pub instances: usize,
    /// The modelled time from a message to its arrival, either way.
    pub latency: Duration,
    /// The Envoy each record goes to, by index (default: round robin).
    pub instance_of: Option<&'a [usize]>,
}

/// Totals of a quota replay.
#[derive(Debug, Clone, Default)]
pub struct QuotaRunStats {
    /// Requests replayed.
    pub requests: usize,
    /// Reports sent.
    pub reports: u64,
    /// Responses received.
    pub responses: u64,
    /// Reports the service refused, and the first reason.
    pub refused: Vec<String>,
    /// Wall time.
    pub wall: Duration,
}

#[derive(Debug)]
enum Event {
    /// An Envoy's periodic report.
    Report(usize),
    /// The service's step of an Envoy's stream.
    Step(usize),
    /// Responses arriving at an Envoy.
    Deliver(usize, Vec<RateLimitQuotaResponse>),
}

/// Schedules `event` at `time_us` (events of one instant run in the order they were made).
fn schedule(queue: &mut EventQueue<Event>, time_us: i64, event: Event) {
    queue.push(u64::try_from(time_us).unwrap_or(0) * 1000, 0, event);
}

/// The next event due at or before `until_us`, and its time.
fn next_until(queue: &mut EventQueue<Event>, until_us: i64) -> Option<(i64, Event)> {
    let until_ns = u64::try_from(until_us).unwrap_or(0) * 1000;
    if queue.peek()?.0 > until_ns {
        return None;
    }
    let (at_ns, event) = queue.pop()?;
    Some(((at_ns / 1000) as i64, event))
}

/// Replays `records` through `setup` against `server`; each decision goes to `decided` in
/// trace order.
pub fn replay(
    setup: &QuotaSetup<'_>,
    records: &[TraceRecord],
    server: &InProcessServer,
    runtime: &tokio::runtime::Runtime,
    decided: &mut dyn FnMut(Decided),
    progress: &mut dyn FnMut(usize),
) -> (QuotaRunStats, ClientAddresses) {
    let started = crate::replay::clock::wall_now();
    let instances = setup.instances.max(1);
    let latency_us = i64::try_from(setup.latency.as_micros()).unwrap_or(i64::MAX);
    let mut envoys: Vec<QuotaEnvoy> = (0..instances).map(|_| QuotaEnvoy::default()).collect();
    let mut streams: Vec<Option<ReplayStream>> = (0..instances).map(|_| None).collect();
    let mut queue = EventQueue::default();
    // Whether each Envoy has opened its first stream and started its timers.
    let mut streaming = vec![false; instances];
    let mut clients = ClientAddresses::default();
    let mut stats = QuotaRunStats::default();
    let domain = setup.config.domain.as_str();
    let send = |stream: &mut Option<ReplayStream>,
                report: RateLimitQuotaUsageReports,
                now_us: i64,
                stats: &mut QuotaRunStats|
     -> Vec<RateLimitQuotaResponse> {
        let Some(open) = stream.as_mut() else {
            return Vec::new();
        };
        stats.reports += 1;
        match runtime.block_on(open.report(report, now_us)) {
            Ok(responses) => responses,
            Err(status) => {
                // The stream ends; the Envoy opens another at its next report.
                stats.refused.push(status.message().to_owned());
                *stream = None;
                Vec::new()
            }
        }
    };
    for (index, record) in records.iter().enumerate() {
        let now_us = record.time_us;
        while let Some((time, event)) = next_until(&mut queue, now_us) {
            match event {
                Event::Deliver(i, responses) => {
                    stats.responses += responses.len() as u64;
                    envoys[i].apply(&responses, time);
                }
                Event::Report(i) => {
                    if streams[i].is_none() {
                        streams[i] = server.quota_stream(time);
                    }
                    if let Some(report) = envoys[i].periodic_report(domain, time) {
                        let responses = send(&mut streams[i], report, time, &mut stats);
                        schedule(
                            &mut queue,
                            time + 2 * latency_us,
                            Event::Deliver(i, responses),
                        );
                    }
                    schedule(&mut queue, time + REPORT_EVERY_US, Event::Report(i));
                }
                Event::Step(i) => {
                    if let Some(stream) = streams[i].as_mut() {
                        let responses = runtime.block_on(stream.step(time));
                        if !responses.is_empty() {
                            schedule(&mut queue, time + latency_us, Event::Deliver(i, responses));
                        }
                    }
                    schedule(&mut queue, time + STEP_EVERY_US, Event::Step(i));
                }
            }
        }
        let instance = setup
            .instance_of
            .and_then(|of| of.get(index).copied())
            .unwrap_or(index)
            % instances;
        let headers = request_headers(record);
        let peer: IpAddr = clients.address(&record.client);
        let request = setup.config.addresses.downstream(&headers, peer);
        let mut decision = Decided {
            index,
            instance,
            status: record.status,
            time_us: now_us,
            lines: Vec::new(),
        };
        if let Some((settings_index, mut key)) = setup.config.bucket(&request) {
            key.sort();
            let settings = &setup.config.settings[settings_index];
            let envoy = &mut envoys[instance];
            let allowed = envoy.decide(&key, settings, now_us);
            if !allowed {
                decision.status = settings.denied_status;
            }
            let id: BucketId = key.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            let rule = setup.limits.rule_for(domain, &id).map_or_else(
                || RuleName::lossy(&format!("{domain}.no_rule")),
                |r| r.name.clone(),
            );
            decision.lines.push(RuleRecord {
                rule,
                key: key
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(","),
                outcome: if allowed {
                    RuleOutcome::Allowed
                } else {
                    RuleOutcome::Denied
                },
                delay_ms: 0,
                local: true,
            });
            if !streaming[instance] {
                // Its first bucket: the Envoy opens its stream and starts its timers. A stream
                // that ends later is opened again at the next periodic report.
                streaming[instance] = true;
                streams[instance] = server.quota_stream(now_us);
                schedule(&mut queue, now_us + STEP_EVERY_US, Event::Step(instance));
                schedule(
                    &mut queue,
                    now_us + REPORT_EVERY_US,
                    Event::Report(instance),
                );
            }
            if let Some(report) = envoys[instance].new_buckets_report(domain, now_us) {
                let responses = send(
                    &mut streams[instance],
                    report,
                    now_us + latency_us,
                    &mut stats,
                );
                schedule(
                    &mut queue,
                    now_us + 2 * latency_us,
                    Event::Deliver(instance, responses),
                );
            }
        }
        stats.requests += 1;
        if stats.requests.is_multiple_of(1024) {
            progress(stats.requests);
        }
        decided(decision);
    }
    let end_us = records.last().map_or(0, |r| r.time_us);
    for stream in streams.into_iter().flatten() {
        runtime.block_on(stream.close(end_us));
    }
    stats.wall = started.elapsed();
    (stats, clients)
}
