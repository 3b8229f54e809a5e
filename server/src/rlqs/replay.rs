//! A quota stream in a replay's time, for `sluice-sim`'s model of Envoy's `rate_limit_quota`
//! filter: the same stream, buckets, fundings and assignments as over gRPC, but told the time
//! at each report and each step instead of reading clocks, and its lease calls decided by the
//! scripts at that time. A replay then runs minutes of traffic in as long as Redis takes, and
//! gives the same answers every time.

use std::sync::Arc;

use sluice_core::rlqs::bucket::Step;
use tokio::sync::mpsc;
use tonic::Status;

use super::RlqsState;
use super::stream::{EnvoyStream, Outbound};
use super::stream_clock::StreamClock;
use crate::app_state::AppState;
use crate::envoy_api::quota::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};

/// Responses one step may send before they are read: a step sends one per 10,000 actions, so
/// this holds the step of a stream of ten million buckets.
const RESPONSES_A_STEP: usize = 1024;

/// One Envoy's quota stream, driven by a replay.
pub struct ReplayStream {
    stream: EnvoyStream,
    rlqs: Arc<RlqsState>,
    outbound: Outbound,
    responses: mpsc::Receiver<Result<RateLimitQuotaResponse, Status>>,
}

impl ReplayStream {
    pub(crate) fn open(state: Arc<AppState>, rlqs: Arc<RlqsState>, now_us: i64) -> ReplayStream {
        let clock = StreamClock::Replay {
            opened_us: now_us,
            now_us,
        };
        let (outbound, responses) = mpsc::channel(RESPONSES_A_STEP);
        ReplayStream {
            stream: EnvoyStream::open(state, Arc::clone(&rlqs), clock),
            rlqs,
            outbound,
            responses,
        }
    }

    /// Takes in `report`, sent at `now_us`, and answers what the stream sends at once (new
    /// buckets' assignments). A report the server refuses ends a gRPC stream: its status is the
    /// error, and this stream must not be used again.
    pub async fn report(
        &mut self,
        report: RateLimitQuotaUsageReports,
        now_us: i64,
    ) -> Result<Vec<RateLimitQuotaResponse>, Status> {
        self.stream.advance_to(now_us);
        let config = self.rlqs.config.current();
        self.stream.take_report(report, &config).await?;
        self.stream
            .step(&config, Step::Report, &self.outbound)
            .await;
        Ok(self.sent())
    }

    /// The stream's step at `now_us` (once a second over gRPC): idle buckets abandoned, the
    /// refills due funded, and the assignments that follow.
    pub async fn step(&mut self, now_us: i64) -> Vec<RateLimitQuotaResponse> {
        self.stream.advance_to(now_us);
        let config = self.rlqs.config.current();
        self.stream.step(&config, Step::Tick, &self.outbound).await;
        self.sent()
    }

    /// Ends the stream as an Envoy's departure ends it: its claims leave the ledgers.
    pub async fn close(mut self, now_us: i64) {
        self.stream.advance_to(now_us);
        self.stream.withdraw().await;
    }

    fn sent(&mut self) -> Vec<RateLimitQuotaResponse> {
        let mut sent = Vec::new();
        while let Ok(Ok(response)) = self.responses.try_recv() {
            sent.push(response);
        }
        sent
    }
}
