//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService`: `StreamRateLimitQuotas`, the
//! stream of usage reports from Envoy's `rate_limit_quota` filter and of assignments back,
//! and its messages, with the strategy types of `envoy.type.v3` they carry.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use futures::Stream;
use tonic::Streaming;

use super::method;
use super::protobuf::{Duration, UInt32Value};

/// The service's name, as gRPC routes it and health checking reports it.
pub const SERVICE: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";

/// `StreamRateLimitQuotas`' path.
pub const STREAM_RATE_LIMIT_QUOTAS: &str =
    "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

/// `RateLimitQuotaUsageReports`: what one Envoy's buckets admitted and denied since its last
/// report.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitQuotaUsageReports {
    /// The filter's domain.
    #[prost(string, tag = "1")]
    pub domain: String,
    /// One usage a bucket.
    #[prost(message, repeated, tag = "2")]
    pub bucket_quota_usages: Vec<BucketQuotaUsage>,
}

/// `RateLimitQuotaUsageReports.BucketQuotaUsage`: one bucket's requests over a span.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BucketQuotaUsage {
    /// The bucket.
    #[prost(message, optional, tag = "1")]
    pub bucket_id: Option<BucketId>,
    /// The span the counts are over.
    #[prost(message, optional, tag = "2")]
    pub time_elapsed: Option<Duration>,
    /// Requests the bucket let through.
    #[prost(uint64, tag = "3")]
    pub num_requests_allowed: u64,
    /// Requests it denied.
    #[prost(uint64, tag = "4")]
    pub num_requests_denied: u64,
}

/// `BucketId`: the bucket's name, as the filter's bucket matcher built it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BucketId {
    /// Its key and value pairs.
    #[prost(map = "string, string", tag = "1")]
    pub bucket: HashMap<String, String>,
}

/// `RateLimitQuotaResponse`: actions for some of an Envoy's buckets.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitQuotaResponse {
    /// One action a bucket.
    #[prost(message, repeated, tag = "1")]
    pub bucket_action: Vec<BucketAction>,
}

/// `RateLimitQuotaResponse.BucketAction`: an assignment for one bucket, or its abandonment.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BucketAction {
    /// The bucket.
    #[prost(message, optional, tag = "1")]
    pub bucket_id: Option<BucketId>,
    /// What the bucket is to do.
    #[prost(oneof = "Action", tags = "2, 3")]
    pub bucket_action: Option<Action>,
}

/// `BucketAction.bucket_action`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Oneof)]
pub enum Action {
    /// Limit the bucket by a strategy, for a while.
    #[prost(message, tag = "2")]
    QuotaAssignmentAction(QuotaAssignmentAction),
    /// Forget the bucket's assignment.
    #[prost(message, tag = "3")]
    AbandonAction(AbandonAction),
}

/// `BucketAction.QuotaAssignmentAction`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct QuotaAssignmentAction {
    /// How long the assignment holds without another.
    #[prost(message, optional, tag = "2")]
    pub assignment_time_to_live: Option<Duration>,
    /// How the bucket limits requests meanwhile.
    #[prost(message, optional, tag = "3")]
    pub rate_limit_strategy: Option<RateLimitStrategy>,
}

/// `BucketAction.AbandonAction`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct AbandonAction {}

/// `envoy.type.v3.RateLimitStrategy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct RateLimitStrategy {
    /// The strategy.
    #[prost(oneof = "Strategy", tags = "1, 3")]
    pub strategy: Option<Strategy>,
}

/// `RateLimitStrategy.strategy`: the two kinds sluice assigns (it never sends the third,
/// `requests_per_time_unit`, field 2).
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Oneof)]
pub enum Strategy {
    /// Every request allowed, or every one denied.
    #[prost(enumeration = "BlanketRule", tag = "1")]
    BlanketRule(i32),
    /// A token bucket.
    #[prost(message, tag = "3")]
    TokenBucket(TokenBucket),
}

/// `RateLimitStrategy.BlanketRule`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, prost::Enumeration)]
#[repr(i32)]
pub enum BlanketRule {
    /// Every request allowed.
    AllowAll = 0,
    /// Every request denied.
    DenyAll = 1,
}

/// `envoy.type.v3.TokenBucket`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct TokenBucket {
    /// The bucket's size, and what it holds at first.
    #[prost(uint32, tag = "1")]
    pub max_tokens: u32,
    /// Tokens added at each fill; 1 when absent.
    #[prost(message, optional, tag = "2")]
    pub tokens_per_fill: Option<UInt32Value>,
    /// The time between fills.
    #[prost(message, optional, tag = "3")]
    pub fill_interval: Option<Duration>,
}

/// `StreamRateLimitQuotas`, as a service answers it.
#[tonic::async_trait]
pub trait RateLimitQuotaService: Send + Sync + 'static {
    /// The stream of assignments the service sends back.
    type Assignments: Stream<Item = Result<RateLimitQuotaResponse, tonic::Status>> + Send + 'static;

    /// One Envoy's stream, from its first report.
    async fn stream_rate_limit_quotas(
        &self,
        request: tonic::Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<tonic::Response<Self::Assignments>, tonic::Status>;
}

/// `StreamRateLimitQuotas`.
pub struct StreamRateLimitQuotas;

impl method::Method for StreamRateLimitQuotas {
    const PATH: &'static str = STREAM_RATE_LIMIT_QUOTAS;
}

impl<S: RateLimitQuotaService> method::Serve<S> for StreamRateLimitQuotas {
    fn serve<B: method::RequestBody>(
        service: Arc<S>,
        request: http::Request<B>,
    ) -> method::BoxFuture<method::Answer, Infallible> {
        Box::pin(async move { Ok(method::server().streaming(Streams(service), request).await) })
    }
}

/// A [`RateLimitQuotaService`] as a gRPC service, ready to route.
pub type RateLimitQuotaServer<S> = method::Server<StreamRateLimitQuotas, S>;

/// A client of the quota service.
pub type RateLimitQuotaClient = method::Client<StreamRateLimitQuotas>;

impl RateLimitQuotaClient {
    /// Opens a stream: `reports` go out as they come, and the assignments come back.
    pub async fn stream_rate_limit_quotas(
        &mut self,
        reports: impl tonic::IntoStreamingRequest<Message = RateLimitQuotaUsageReports>,
    ) -> Result<tonic::Response<Streaming<RateLimitQuotaResponse>>, tonic::Status> {
        let (channel, path) = self.ready().await?;
        let codec = tonic_prost::ProstCodec::default();
        channel
            .streaming(reports.into_streaming_request(), path, codec)
            .await
    }
}

/// One stream, to the service.
struct Streams<S>(Arc<S>);

impl<S: RateLimitQuotaService> tonic::server::StreamingService<RateLimitQuotaUsageReports>
    for Streams<S>
{
    type Response = RateLimitQuotaResponse;
    type ResponseStream = S::Assignments;
    type Future = method::BoxFuture<tonic::Response<S::Assignments>, tonic::Status>;

    fn call(
        &mut self,
        request: tonic::Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Self::Future {
        let service = Arc::clone(&self.0);
        Box::pin(async move { service.stream_rate_limit_quotas(request).await })
    }
}
