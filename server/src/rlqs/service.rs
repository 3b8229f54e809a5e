//! The gRPC service: `StreamRateLimitQuotas`, one [`stream`](super::stream) per call.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use super::stream;
use crate::app_state::AppState;
use crate::envoy_api::quota::{
    RateLimitQuotaResponse, RateLimitQuotaServer, RateLimitQuotaService, RateLimitQuotaUsageReports,
};
use crate::inbound::authorize;

/// `envoy.service.rate_limit_quota.v3.RateLimitQuotaService` over the server's state.
#[derive(Clone)]
pub struct RlqsService {
    state: Arc<AppState>,
}

/// The gRPC service, ready to route.
pub fn rate_limit_quota_service(state: Arc<AppState>) -> RateLimitQuotaServer<RlqsService> {
    RateLimitQuotaServer::new(RlqsService { state })
}

/// The assignments of one stream, as tonic sends them.
pub type Assignments = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

/// Assignments in flight to one Envoy: a stream whose Envoy reads slowly holds this many
/// before its step waits.
const OUTBOUND_BUFFER: usize = 8;

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type Assignments = Assignments;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Assignments>, Status> {
        let Some(rlqs) = &self.state.rlqs else {
            return Err(Status::unimplemented(
                "this server has no quota configuration: start it with --rlqs-config",
            ));
        };
        let (metadata, _, inbound) = request.into_parts();
        authorize(&self.state, &metadata.into_headers()).map_err(Status::unauthenticated)?;
        let (outbound, assignments) = mpsc::channel(OUTBOUND_BUFFER);
        tokio::spawn(stream::serve(
            Arc::clone(&self.state),
            Arc::clone(rlqs),
            inbound,
            outbound,
        ));
        let assignments = futures::stream::unfold(assignments, |mut assignments| async move {
            assignments.recv().await.map(|item| (item, assignments))
        });
        Ok(Response::new(Box::pin(assignments)))
    }
}
