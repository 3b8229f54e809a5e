//! One Envoy's quota stream: its reports in, its buckets' assignments out.
//!
//! The stream is one holder in each of its buckets' lease ledgers. Once a second it funds the
//! refills that are due (lease calls of up to [`MAX_ASKS`] asks, several built ahead, let into
//! Redis by the server's [`lane`](super::lane) in the order of their deadlines) and sends the
//! assignments that changed or are due for renewal, as the calls answer; a report is taken in
//! at once, and a new bucket is funded and assigned at once, since the Envoy serves it by its
//! `no_assignment_behavior` until then.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesOrdered;
use sluice_core::rlqs::bucket::{Assignment, Bucket, FUNDING_STEP_MS, REFILL_EARLY_MS, Step};
use sluice_core::rlqs::report::Report;
use sluice_core::rlqs::{BucketId, RlqsConfig};
use sluice_core::wire::{LeaseAsk, LeaseRequest, MAX_ASKS};
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;
use tonic::{Status, Streaming};

use super::RlqsState;
use super::action::{abandon, assign};
use super::report::from_proto;
use super::stats::RlqsStats;
use super::stream_clock::StreamClock;
use crate::app_state::AppState;
use crate::envoy_api::quota::{BucketAction, RateLimitQuotaResponse, RateLimitQuotaUsageReports};

/// How often a stream funds its buckets' refills and renews their assignments.
pub const STEP_EVERY: Duration = Duration::from_millis(FUNDING_STEP_MS);

/// The most actions a step sends in one response before its fundings are all in: a stream's
/// first report of many buckets has its first assignments while the rest are funded. (Few
/// parts, not one a lease call: Envoy 1.40 copies its whole bucket cache to its workers after
/// every response.)
pub const ACTIONS_A_RESPONSE: usize = 10_000;

/// The buckets of a report taken in before the stream lets its thread's other tasks run.
const REPORT_PART: usize = 4096;

/// The lease calls a step keeps built: in Redis, or waiting in the lane for a place
/// ([`super::lane`]). Twice the lane's places, so that as the step's calls answer, even all at
/// once (after a stall), each place goes to the next of the step's own calls, built and
/// waiting, not to a later stream's.
const LEASE_CALLS_AHEAD: usize = 2 * super::FUNDING_CALLS_IN_REDIS;

/// What the stream sends: assignments, or the status that ends it.
pub type Outbound = mpsc::Sender<Result<RateLimitQuotaResponse, Status>>;

/// A (domain, bucket id). The domain is shared by the buckets of one report.
type BucketName = (Arc<str>, BucketId);

/// One Envoy's stream and its buckets.
pub(super) struct EnvoyStream {
    state: Arc<AppState>,
    rlqs: Arc<RlqsState>,
    /// This stream's name in the lease ledgers.
    holder: String,
    buckets: HashMap<BucketName, Bucket>,
    clock: StreamClock,
}

/// Serves one stream until the Envoy closes it, it goes away, or sends what is refused.
pub async fn serve(
    state: Arc<AppState>,
    rlqs: Arc<RlqsState>,
    mut inbound: Streaming<RateLimitQuotaUsageReports>,
    outbound: Outbound,
) {
    let mut stream = EnvoyStream::open(
        state,
        Arc::clone(&rlqs),
        StreamClock::Wall(crate::clock::monotonic()),
    );
    let mut steps = tokio::time::interval(STEP_EVERY);
    steps.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut stopping = stream.state.stopping.clone();
    let shutdown = async move {
        // A server that never shuts down drops its sender: then this never completes.
        if stopping.wait_for(|s| *s).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::pin!(shutdown);
    // Whether the stream ended on the Envoy's side (it closed, went away, or was refused), not
    // for the server's shutdown.
    let departed = loop {
        let open = tokio::select! {
            message = inbound.message() => {
                let message = match message {
                    Ok(Some(message)) => message,
                    // The Envoy closed its side, or the connection went.
                    Ok(None) | Err(_) => break true,
                };
                let config = rlqs.config.current();
                if let Err(status) = stream.take_report(message, &config).await {
                    stream.state.metrics.rlqs().refused();
                    tracing::debug!(%status, "quota report refused");
                    let _ = outbound.send(Err(status)).await;
                    break true;
                }
                stream.step(&config, Step::Report, &outbound).await
            }
            _ = steps.tick() => stream.step(&rlqs.config.current(), Step::Tick, &outbound).await,
            () = outbound.closed() => break true,
            () = &mut shutdown => {
                // The Envoy opens a new stream, to another replica, at its next report; its
                // assignments live until then, and so do its claims in the ledgers.
                let status = Status::unavailable("sluice-server is shutting down");
                let _ = outbound.send(Err(status)).await;
                break false;
            }
        };
        if !open {
            break true;
        }
    };
    if departed {
        stream.withdraw().await;
    }
}

impl EnvoyStream {
    pub(super) fn open(
        state: Arc<AppState>,
        rlqs: Arc<RlqsState>,
        clock: StreamClock,
    ) -> EnvoyStream {
        state.metrics.rlqs().stream(true);
        EnvoyStream {
            state,
            rlqs,
            holder: holder_name(),
            buckets: HashMap::new(),
            clock,
        }
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Moves a replay's stream to `now_us` (never back); a stream on the wall clock keeps it.
    pub(super) fn advance_to(&mut self, now_us: i64) {
        if let StreamClock::Replay {
            now_us: current, ..
        } = &mut self.clock
        {
            *current = (*current).max(now_us);
        }
    }

    /// Takes in one report: each bucket's use, under the rule the configuration now gives it.
    /// A report of many buckets is taken in parts, letting the thread's other tasks run
    /// between them: among them the Redis answers of other streams' fundings, which a report
    /// of 50,000 buckets (about 0.1 s) held past the Redis timeout, failing them.
    pub(super) async fn take_report(
        &mut self,
        message: RateLimitQuotaUsageReports,
        config: &RlqsConfig,
    ) -> Result<(), Status> {
        let Report { domain, usages } = from_proto(message)?;
        let domain: Arc<str> = Arc::from(domain);
        let Some(rules) = config.domain(&domain) else {
            return Err(Status::invalid_argument(format!(
                "domain: `{domain}` is not a domain of this server's --rlqs-config"
            )));
        };
        let stats = self.state.metrics.rlqs();
        stats.report();
        let now_ms = self.now_ms();
        let mut held = self.buckets.len();
        // Room for the buckets a report may add, at once (up to the stream's cap): a first
        // report of 50,000 would otherwise grow the map by doubling, each time rehashing
        // every bucket into fresh memory.
        let room = self.rlqs.max_buckets_per_stream.saturating_sub(held);
        self.buckets
            .reserve(usages.len().saturating_sub(held).min(room));
        // Requests by rule, counted once a report: a labelled counter's look-up a bucket was
        // a tenth of the report's time.
        let mut used: Vec<(&str, u64, u64)> = Vec::new();
        for (i, usage) in usages.into_iter().enumerate() {
            if i > 0 && i % REPORT_PART == 0 {
                tokio::task::yield_now().await;
            }
            let rule = rules.rule_for(&usage.bucket);
            match used
                .iter_mut()
                .find(|(name, ..)| *name == rule.name.as_str())
            {
                Some((_, allowed, denied)) => {
                    *allowed = allowed.saturating_add(usage.allowed);
                    *denied = denied.saturating_add(usage.denied);
                }
                None => used.push((rule.name.as_str(), usage.allowed, usage.denied)),
            }
            let bucket = match self
                .buckets
                .entry((Arc::clone(&domain), usage.bucket.clone()))
            {
                Entry::Occupied(known) => {
                    let bucket = known.into_mut();
                    bucket.follow(rule, now_ms);
                    bucket
                }
                Entry::Vacant(new) => {
                    let refused = if held >= self.rlqs.max_buckets_per_stream {
                        Some("stream_cap")
                    } else if !self.rlqs.take_bucket() {
                        Some("server_cap")
                    } else {
                        None
                    };
                    if let Some(cap) = refused {
                        refuse_bucket(&self.state, cap);
                        continue;
                    }
                    stats.buckets(1);
                    held += 1;
                    new.insert(Bucket::new(&domain, &usage.bucket, rule, now_ms))
                }
            };
            bucket.report(&usage, now_ms);
        }
        for (rule, allowed, denied) in used {
            stats.usage(&domain, rule, allowed, denied);
        }
        Ok(())
    }

    /// Abandons idle buckets, funds the refills due at this `step`, and sends the actions
    /// that follow: in parts of [`ACTIONS_A_RESPONSE`] as the fundings answer, the rest at
    /// the end. `false` when the Envoy's side is gone.
    pub(super) async fn step(
        &mut self,
        config: &RlqsConfig,
        step: Step,
        outbound: &Outbound,
    ) -> bool {
        let now_ms = self.now_ms();
        // When its calls are due in Redis, against other streams' ([`super::lane`]): a
        // refill's when it falls due, at the latest.
        let started = crate::clock::monotonic();
        let deadline = match step {
            Step::Report => started,
            Step::Tick => started + Duration::from_millis(REFILL_EARLY_MS),
        };
        let mut actions = self.abandon_idle(config, now_ms);
        let state = Arc::clone(&self.state);
        let replay_us = self.clock.replay_us();
        let stats = state.metrics.rlqs();
        // Assignments no funding makes: blanket ones.
        for (name, bucket) in &mut self.buckets {
            if let Some(assignment) = bucket.blanket() {
                send_if_due(stats, name, bucket, assignment, now_ms, &mut actions);
            }
        }
        // Only the names and spans of what is due: each lease call is built as it is sent, so
        // that the first goes to Redis at once, and a first report of 50,000 buckets is not
        // first copied into 50,000 asks (13 MB, then moved twice).
        let mut due: Vec<(u64, BucketName)> = self
            .buckets
            .iter()
            .filter_map(|(name, bucket)| {
                let span_ms = bucket.funding_due(now_ms, step)?;
                Some((span_ms, name.clone()))
            })
            .collect();
        // Shortest spans first: a busy bucket's funding then reaches Redis at the same point of
        // every step, however many quiet fundings fall due behind it. (Behind a step's tail of
        // 20,000 quiet fundings, two fundings of one busy bucket came half a span closer
        // together than its span, and the second found the algorithm units short.)
        due.sort_by_key(|(span_ms, _)| *span_ms);
        let mut chunks = due.chunks(MAX_ASKS);
        // Calls that failed (a Redis answer later than the timeout, or none), asked again once
        // after the rest: else a report's buckets in them would wait for the first tick after
        // the report's whole step, seconds on. (A failed call that did fund in Redis is
        // funded again: the first grant goes unused, less admitted, never more.)
        let mut failed: Vec<Vec<&BucketName>> = Vec::new();
        // Several calls built ahead, so that Redis is not left waiting on the server between
        // them; answered in order, each with its names.
        let mut in_flight = FuturesOrdered::new();
        loop {
            while in_flight.len() < LEASE_CALLS_AHEAD {
                let Some((names, again)) = chunks
                    .next()
                    .map(|chunk| (chunk.iter().map(|(_, name)| name).collect(), false))
                    .or_else(|| failed.pop().map(|names| (names, true)))
                else {
                    break;
                };
                let (names, asks): (Vec<&BucketName>, Vec<LeaseAsk>) = names
                    .into_iter()
                    .filter_map(|name| Some((name, self.funding_ask(name, now_ms, step)?)))
                    .unzip();
                let request = self.lease_request(asks);
                let state = Arc::clone(&state);
                let lane = Arc::clone(&self.rlqs.lane);
                in_flight.push_back(async move {
                    let _place = lane.enter(deadline).await;
                    (state.engine.lease(&request, replay_us).await, names, again)
                });
            }
            let Some((answer, names, again)) = in_flight.next().await else {
                break;
            };
            let grants = match answer {
                Ok(response) => response.grants,
                Err(e) => {
                    stats.funding_failed();
                    if let Some(left_out) = state
                        .failure_warnings
                        .quota_funding
                        .due(crate::clock::monotonic())
                    {
                        tracing::warn!(error = %e, left_out, "quota funding failed: Envoys keep their assignments until they lapse");
                    }
                    if !again {
                        failed.push(names);
                    }
                    continue;
                }
            };
            for (name, grant) in names.into_iter().zip(&grants) {
                let Some(bucket) = self.buckets.get_mut(name) else {
                    continue;
                };
                if grant.crowded {
                    refuse_bucket(&state, "holder_cap");
                    bucket.crowded_out(grant, now_ms);
                    continue;
                }
                if let Some(assignment) = bucket.funded(grant, now_ms) {
                    send_if_due(stats, name, bucket, assignment, now_ms, &mut actions);
                }
            }
            if actions.len() >= ACTIONS_A_RESPONSE && !send(outbound, &mut actions).await {
                return false;
            }
        }
        actions.is_empty() || send(outbound, &mut actions).await
    }

    /// The ask that funds bucket `name`'s refill due at `step`, with this server's cap on
    /// holders.
    fn funding_ask(&self, name: &BucketName, now_ms: u64, step: Step) -> Option<LeaseAsk> {
        let ask = self.buckets.get(name)?.funding_ask(now_ms, step)?;
        Some(LeaseAsk {
            max_holders: self.rlqs.max_holders_per_bucket,
            ..ask
        })
    }

    /// The stream's lease request for `asks`. Its holder name is unguessable, so it sends no
    /// secret (see [`holder_name`]).
    fn lease_request(&self, asks: Vec<LeaseAsk>) -> LeaseRequest {
        LeaseRequest {
            holder: self.holder.clone(),
            secret: String::new(),
            asks,
        }
    }

    /// Takes the stream's claims to shares out of its buckets' ledgers, so that the other
    /// Envoys' shares grow at their next funding rather than a TTL later. (The Envoy may still
    /// enforce its last assignments until they lapse: docs/algorithms.md counts them.)
    pub(super) async fn withdraw(&mut self) {
        let asks: Vec<LeaseAsk> = self
            .buckets
            .values()
            .filter_map(Bucket::withdrawal_ask)
            .collect();
        for chunk in asks.chunks(MAX_ASKS) {
            let request = self.lease_request(chunk.to_vec());
            if let Err(e) = self
                .state
                .engine
                .lease(&request, self.clock.replay_us())
                .await
            {
                // Then the claims lapse with the ledger's TTL, as before.
                tracing::debug!(error = %e, "a departed quota stream's claims were not withdrawn");
                return;
            }
        }
    }

    /// Forgets the buckets no report has shown a request for in their domain's `idle_after`,
    /// telling the Envoy to forget them too.
    fn abandon_idle(&mut self, config: &RlqsConfig, now_ms: u64) -> Vec<BucketAction> {
        let stats = self.state.metrics.rlqs();
        let mut actions = Vec::new();
        self.buckets.retain(|(domain, id), bucket| {
            let idle = bucket.idle(now_ms, config.idle_after(domain));
            if idle {
                stats.forgotten(domain, bucket.rule.as_str(), bucket.last_sent(), true);
                stats.buckets(-1);
                self.rlqs.give_back(1);
                actions.push(abandon(id));
            }
            !idle
        });
        actions
    }
}

/// Sends `actions` as one response, leaving it empty; `false` when the Envoy's side is gone.
async fn send(outbound: &Outbound, actions: &mut Vec<BucketAction>) -> bool {
    let response = RateLimitQuotaResponse {
        bucket_action: std::mem::take(actions),
    };
    outbound.send(Ok(response)).await.is_ok()
}

/// Adds `assignment` for bucket `name` to `actions`, and counts it, if it is new or due for
/// renewal.
fn send_if_due(
    stats: &RlqsStats,
    (domain, id): &BucketName,
    bucket: &mut Bucket,
    assignment: Assignment,
    now_ms: u64,
    actions: &mut Vec<BucketAction>,
) {
    if bucket.due(&assignment, now_ms) {
        stats.assigned(
            domain,
            bucket.rule.as_str(),
            &assignment,
            bucket.last_sent(),
        );
        bucket.sent(assignment, now_ms);
        actions.push(assign(id, &assignment, bucket.assignment_ttl_s(now_ms)));
    }
}

impl Drop for EnvoyStream {
    fn drop(&mut self) {
        let stats = self.state.metrics.rlqs();
        for ((domain, _), bucket) in &self.buckets {
            stats.forgotten(domain, bucket.rule.as_str(), bucket.last_sent(), false);
        }
        stats.buckets(-(self.buckets.len() as i64));
        self.rlqs.give_back(self.buckets.len());
        stats.stream(false);
    }
}

/// Counts a bucket refused for `cap` (`stream_cap`, `server_cap`, `holder_cap`), and says so
/// in the log now and then.
fn refuse_bucket(state: &AppState, cap: &'static str) {
    state.metrics.rlqs().bucket_refused(cap);
    if let Some(left_out) = state
        .failure_warnings
        .quota_buckets
        .due(crate::clock::monotonic())
    {
        tracing::warn!(
            cap,
            left_out,
            "a quota bucket past a cap gets no assignment: its Envoy applies its no_assignment_behavior"
        );
    }
}

/// A name no other stream has, on this server or another, and no client can guess: the holder
/// in the ledgers. Being unguessable, it needs no secret beside it (which would cost every
/// bucket's ledger 33 bytes in Redis). Should the OS have no random bytes to give, a name
/// unique but guessable: the process' random hash state and a count.
fn holder_name() -> String {
    let mut random = [0u8; 12];
    match getrandom::fill(&mut random) {
        Ok(()) => {
            format!("rlqs:{}", sluice_core::hex::lower_hex(&random))
        }
        Err(e) => {
            tracing::warn!(error = %e, "no random bytes for a quota stream's holder name");
            static PROCESS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
            static STREAMS: AtomicU64 = AtomicU64::new(0);
            let process = *PROCESS.get_or_init(|| RandomState::new().hash_one(std::process::id()));
            format!(
                "rlqs:{process:016x}:{}",
                STREAMS.fetch_add(1, Ordering::Relaxed)
            )
        }
    }
}
