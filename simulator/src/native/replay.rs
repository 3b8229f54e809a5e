//! A trace through the modelled native filter, in virtual time: each request's calls go to
//! sluice-server as gRPC `ShouldRateLimit`, stamped with the virtual time they are sent at, and
//! the answers decide the request as Envoy's filter decides it.
//!
//! A call is answered a modelled latency after it is sent; a filter later in the chain sends
//! its call when the one before has answered. A call whose latency reaches the filter's
//! `timeout` still reaches the server (its hits count), but Envoy has given up on it: the
//! failure mode decides. Calls on one descriptor reach the server in trace order; others go
//! side by side, so nothing depends on how fast the machine is.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use prost::Message;
use sluice_core::key::RuleName;
use sluice_core::record::{RuleOutcome, RuleRecord};
use sluice_core::rls::RlsConfig;
use sluice_core::wire::REPLAY_TIME_HEADER;
use sluice_server::envoy_api::ratelimit::{
    Code, DescriptorEntry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse,
};
use sluice_server::rls::unary;

use super::{Descriptor, FilterCall, NativeConfig};
use crate::connect::{Endpoint, HttpClient};
use crate::decided::Decided;
use crate::key_order::KeyOrder;
use crate::replay::DEFAULT_AUTHORITY;
use crate::trace::{ClientAddresses, TraceRecord};

/// The call's path.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Requests decided at once: enough to keep Redis busy while the replay goes on.
const IN_FLIGHT: usize = 256;

/// What the replay is run through.
pub struct NativeSetup<'a> {
    /// The Envoy configuration.
    pub config: &'a NativeConfig,
    /// The service's limits, to name each descriptor's rule and counter as the server does.
    pub limits: &'a RlsConfig,
    /// Envoys taking the trace round robin.
    pub instances: usize,
    /// The modelled time from a call to its answer.
    pub callout_latency: Duration,
}

/// Totals of a native replay.
#[derive(Debug, Clone, Default)]
pub struct NativeRunStats {
    /// Requests replayed.
    pub requests: usize,
    /// `ShouldRateLimit` calls made.
    pub calls: u64,
    /// Calls that failed (no answer in time, an error status, an unreadable answer).
    pub failed_calls: u64,
    /// The first failure, as said.
    pub first_failure: Option<String>,
    /// Wall time.
    pub wall: Duration,
}

/// Replays `records` through `setup`, calling the server at `endpoint`; each decision goes to
/// `decided` in trace order, and `progress` hears how many requests are done.
pub fn replay(
    setup: &NativeSetup<'_>,
    records: &[TraceRecord],
    endpoint: &Endpoint,
    runtime: &tokio::runtime::Runtime,
    decided: &mut dyn FnMut(Decided),
    progress: &mut dyn FnMut(usize),
) -> (NativeRunStats, ClientAddresses) {
    let started = crate::replay::clock::wall_now();
    let client = HttpClient::new(
        setup
            .config
            .filters
            .iter()
            .map(|f| (endpoint.authority(&f.cluster), endpoint.clone()))
            .collect(),
    );
    let mut clients = ClientAddresses::default();
    let mut order = KeyOrder::default();
    let mut stats = NativeRunStats::default();
    let instances = setup.instances.max(1);
    runtime.block_on(async {
        let mut in_flight = VecDeque::with_capacity(IN_FLIGHT);
        for (index, record) in records.iter().enumerate() {
            let headers = request_headers(record);
            let peer: IpAddr = clients.address(&record.client);
            let request = setup.config.downstream(&headers, peer);
            let calls = setup.config.calls(&request);
            let planned = plan(setup, &calls);
            let keys: Vec<u64> = planned
                .iter()
                .flat_map(|c| c.descriptors.iter().map(|d| d.ordering_hash))
                .collect();
            let (waits, done) = order.enter(Some(&keys));
            stats.calls += planned.len() as u64;
            let task = Task {
                client: client.clone(),
                endpoint: endpoint.clone(),
                latency: setup.callout_latency,
                index,
                instance: index % instances,
                status: record.status,
                time_us: record.time_us,
                calls: planned,
            };
            in_flight.push_back(tokio::spawn(async move {
                for wait in waits {
                    let _ = wait.await;
                }
                let decision = task.run().await;
                drop(done);
                decision
            }));
            if in_flight.len() >= IN_FLIGHT {
                finish(in_flight.pop_front(), &mut stats, decided, progress).await;
            }
        }
        while let Some(next) = in_flight.pop_front() {
            finish(Some(next), &mut stats, decided, progress).await;
        }
    });
    stats.wall = started.elapsed();
    (stats, clients)
}

async fn finish(
    task: Option<tokio::task::JoinHandle<(Decided, Vec<String>)>>,
    stats: &mut NativeRunStats,
    decided: &mut dyn FnMut(Decided),
    progress: &mut dyn FnMut(usize),
) {
    let Some(task) = task else { return };
    // A task only ends early if the runtime is shutting down; nothing is left to record then.
    let Ok((decision, failures)) = task.await else {
        return;
    };
    stats.failed_calls += failures.len() as u64;
    if stats.first_failure.is_none() {
        stats.first_failure = failures.into_iter().next();
    }
    stats.requests += 1;
    if stats.requests.is_multiple_of(1024) {
        progress(stats.requests);
    }
    decided(decision);
}

/// The request's headers, with the pseudo-headers Envoy gives the filters.
pub(crate) fn request_headers(record: &TraceRecord) -> Vec<(String, String)> {
    let mut headers = vec![
        (
            ":authority".to_owned(),
            record
                .host
                .clone()
                .unwrap_or_else(|| DEFAULT_AUTHORITY.to_owned()),
        ),
        (":path".to_owned(), record.target.clone()),
        (":method".to_owned(), record.method.clone()),
        (":scheme".to_owned(), "http".to_owned()),
    ];
    headers.extend(
        record
            .headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone())),
    );
    headers
}

/// One filter's call, with each descriptor named as the server will count it.
struct PlannedCall {
    domain: String,
    cluster: String,
    timeout: Duration,
    failure_mode_deny: bool,
    rate_limited_status: u16,
    descriptors: Vec<NamedDescriptor>,
}

struct NamedDescriptor {
    entries: Descriptor,
    rule: RuleName,
    counter: String,
    ordering_hash: u64,
}

fn plan(setup: &NativeSetup<'_>, calls: &[FilterCall]) -> Vec<PlannedCall> {
    calls
        .iter()
        .map(|call| {
            let filter = &setup.config.filters[call.filter];
            let descriptors = call
                .descriptors
                .iter()
                .map(|entries| {
                    let pairs: Vec<(&str, &str)> = entries
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    let (rule, counter) = match setup.limits.lookup(&filter.domain, &pairs) {
                        Some(found) => (found.rule.rule_name.clone(), found.counter),
                        None => (
                            no_limit_rule(&filter.domain, entries),
                            descriptor_text(entries),
                        ),
                    };
                    let mut hasher = std::hash::DefaultHasher::new();
                    (&filter.domain, entries).hash(&mut hasher);
                    NamedDescriptor {
                        entries: entries.clone(),
                        rule,
                        counter,
                        ordering_hash: hasher.finish(),
                    }
                })
                .collect();
            PlannedCall {
                domain: filter.domain.clone(),
                cluster: filter.cluster.clone(),
                timeout: filter.timeout,
                failure_mode_deny: filter.failure_mode_deny,
                rate_limited_status: filter.rate_limited_status,
                descriptors,
            }
        })
        .collect()
}

/// The report's name for descriptors the service has no limit for: their keys, under the
/// domain, so that they are seen rather than left out.
fn no_limit_rule(domain: &str, entries: &Descriptor) -> RuleName {
    let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
    RuleName::lossy(&format!("{domain}.{}.no_limit", keys.join(".")))
}

fn descriptor_text(entries: &Descriptor) -> String {
    entries
        .iter()
        .map(|(k, v)| format!("{k}_{v}"))
        .collect::<Vec<_>>()
        .join(".")
}

/// One request's calls, run in order.
struct Task {
    client: HttpClient,
    endpoint: Endpoint,
    latency: Duration,
    index: usize,
    instance: usize,
    status: u16,
    time_us: i64,
    calls: Vec<PlannedCall>,
}

impl Task {
    async fn run(self) -> (Decided, Vec<String>) {
        let mut decision = Decided {
            index: self.index,
            instance: self.instance,
            status: self.status,
            time_us: self.time_us,
            lines: Vec::new(),
        };
        let mut failures = Vec::new();
        let latency_us = i64::try_from(self.latency.as_micros()).unwrap_or(i64::MAX);
        for (step, call) in self.calls.iter().enumerate() {
            let sent_us = self
                .time_us
                .saturating_add(latency_us.saturating_mul(step as i64));
            let answered = self.send(call, sent_us).await;
            // Envoy has given up on a call whose answer comes at or after its timeout.
            let answered = answered.and_then(|a| {
                if self.latency >= call.timeout {
                    Err(format!(
                        "the modelled latency {:?} reaches the filter's timeout {:?}",
                        self.latency, call.timeout
                    ))
                } else {
                    Ok(a)
                }
            });
            match answered {
                Ok(response) => {
                    let over = response.overall_code == Code::OverLimit as i32;
                    for (i, d) in call.descriptors.iter().enumerate() {
                        let code = response.statuses.get(i).map_or(Code::Ok as i32, |s| s.code);
                        let outcome = match (code == Code::OverLimit as i32, over) {
                            (true, _) => RuleOutcome::Denied,
                            (false, true) => RuleOutcome::Skipped,
                            (false, false) => RuleOutcome::Allowed,
                        };
                        decision.lines.push(line(d, outcome));
                    }
                    if over {
                        decision.status = call.rate_limited_status;
                        break;
                    }
                }
                Err(why) => {
                    failures.push(why);
                    decision.lines.extend(
                        call.descriptors
                            .iter()
                            .map(|d| line(d, RuleOutcome::Failed)),
                    );
                    if call.failure_mode_deny {
                        decision.status = 500;
                        break;
                    }
                }
            }
        }
        (decision, failures)
    }

    async fn send(&self, call: &PlannedCall, time_us: i64) -> Result<RateLimitResponse, String> {
        let message = RateLimitRequest {
            domain: call.domain.clone(),
            descriptors: call
                .descriptors
                .iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .entries
                        .iter()
                        .map(|(key, value)| DescriptorEntry {
                            key: key.clone(),
                            value: value.clone(),
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        };
        let wall_limit = (call.timeout * 10).max(Duration::from_secs(2));
        tokio::time::timeout(
            wall_limit,
            should_rate_limit(
                &self.client,
                &self.endpoint,
                &call.cluster,
                &message,
                time_us,
            ),
        )
        .await
        .unwrap_or_else(|_| Err(format!("no answer in {wall_limit:?} of wall time")))
    }
}

fn line(descriptor: &NamedDescriptor, outcome: RuleOutcome) -> RuleRecord {
    RuleRecord {
        rule: descriptor.rule.clone(),
        key: descriptor.counter.clone(),
        outcome,
        delay_ms: 0,
        local: false,
    }
}

/// One unary `ShouldRateLimit` call, stamped with `time_us` for a server in replay mode.
async fn should_rate_limit(
    client: &HttpClient,
    endpoint: &Endpoint,
    cluster: &str,
    message: &RateLimitRequest,
    time_us: i64,
) -> Result<RateLimitResponse, String> {
    let body = unary::framed(&message.encode_to_vec());
    let request = http::Request::post(format!(
        "http://{}{SHOULD_RATE_LIMIT}",
        endpoint.authority(cluster)
    ))
    .header(http::header::CONTENT_TYPE, "application/grpc")
    .header(http::header::TE, "trailers")
    .header(REPLAY_TIME_HEADER, time_us.to_string())
    .body(Bytes::from(body))
    .map_err(|e| format!("building the call: {e}"))?;
    let response = client
        .send(endpoint, request)
        .await
        .map_err(|e| format!("sending the call: {e}"))?;
    let (parts, body) = response.into_parts();
    if parts.status != http::StatusCode::OK {
        return Err(format!("the service answered HTTP {}", parts.status));
    }
    let collected = body
        .collect()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?;
    let trailers = collected.trailers().cloned();
    let data = collected.to_bytes();
    let grpc_status = trailers
        .as_ref()
        .and_then(|t| t.get("grpc-status"))
        .or_else(|| parts.headers.get("grpc-status"))
        .and_then(|s| s.to_str().ok())
        .map(str::to_owned);
    if grpc_status.as_deref() != Some("0") {
        let message = trailers
            .as_ref()
            .and_then(|t| t.get("grpc-message"))
            .or_else(|| parts.headers.get("grpc-message"))
            .and_then(|m| m.to_str().ok())
            .unwrap_or_default();
        return Err(format!(
            "grpc-status {} {message}",
            grpc_status.as_deref().unwrap_or("missing")
        ));
    }
    let message = unary::message(&data)
        .map_err(|status| format!("the answer's message: {}", status.message()))?;
    RateLimitResponse::decode(message)
        .map_err(|e| format!("the answer is not a RateLimitResponse: {e}"))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use axum::response::IntoResponse;

    use super::*;

    /// A service that answers every call with `body`, saying the call succeeded.
    async fn answering(body: Vec<u8>) -> Endpoint {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = axum::Router::new().fallback(move || async move {
            let headers = [("content-type", "application/grpc"), ("grpc-status", "0")];
            (headers, body).into_response()
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        Endpoint::Tcp(address.to_string())
    }

    async fn call(endpoint: &Endpoint) -> Result<RateLimitResponse, String> {
        let authority = endpoint.authority("ratelimit");
        let client = HttpClient::new(HashMap::from([(authority, endpoint.clone())]));
        should_rate_limit(
            &client,
            endpoint,
            "ratelimit",
            &RateLimitRequest::default(),
            0,
        )
        .await
    }

    /// The prefix gives the message's length: bytes past it were read as part of the message
    /// (protobuf's last field wins, so an OK answer followed by `overall_code: OVER_LIMIT`
    /// read as over the limit), and an answer cut short failed only as bad protobuf.
    #[tokio::test]
    async fn an_answer_is_refused_unless_its_prefix_gives_its_length() {
        let answer = RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..RateLimitResponse::default()
        };
        let body = unary::framed(&answer.encode_to_vec());
        let whole = call(&answering(body.clone()).await).await;
        assert_eq!(whole.map(|r| r.overall_code), Ok(Code::Ok as i32));

        let over_limit = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            ..RateLimitResponse::default()
        };
        let mut longer = body.clone();
        longer.extend_from_slice(&over_limit.encode_to_vec());
        let mut shorter = body;
        shorter.pop();
        for (body, holds) in [(longer, "holds 4 bytes"), (shorter, "holds 1 bytes")] {
            let why = call(&answering(body).await).await.unwrap_err();
            assert!(why.starts_with("the answer's message: "), "{why}");
            assert!(why.contains(holds) && why.contains("which says 2"), "{why}");
        }
    }
}
