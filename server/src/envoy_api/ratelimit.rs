//! `envoy.service.ratelimit.v3.RateLimitService`: `ShouldRateLimit`, Envoy's `ratelimit`
//! filter's one call, and its messages.

use std::convert::Infallible;
use std::sync::Arc;

use super::method;
use super::protobuf::{Duration, UInt64Value};

/// The service's name, as gRPC routes it and health checking reports it.
pub const SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// `ShouldRateLimit`'s path.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// `RateLimitRequest`: the descriptors of one request, in one domain.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitRequest {
    /// The domain the descriptors are looked up in.
    #[prost(string, tag = "1")]
    pub domain: String,
    /// The descriptors, each decided on its own.
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// How many hits the request counts for; 0 means 1.
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    /// The key and value pairs, in order.
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<DescriptorEntry>,
    /// A limit the request carries, in place of the configured one.
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// This descriptor's own hits, in place of the request's.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
    /// Whether the hits are given back rather than taken.
    #[prost(bool, tag = "4")]
    pub is_negative_hits: bool,
}

/// `RateLimitDescriptor.Entry`: one key and its value.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct DescriptorEntry {
    /// The key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `RateLimitDescriptor.RateLimitOverride`: a limit sent with the request.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct RateLimitOverride {
    /// Requests a unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// `envoy.type.v3.RateLimitUnit`, as
    /// [`sluice_core::rls::Unit::from_proto`] reads it (an enum is an `int32` on the wire).
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `RateLimitResponse`: the overall answer and each descriptor's.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResponse {
    /// Over the limit if any descriptor is.
    #[prost(enumeration = "Code", tag = "1")]
    pub overall_code: i32,
    /// One status a descriptor, in the request's order.
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    /// Headers Envoy adds to its response to the client.
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
}

/// `RateLimitResponse.DescriptorStatus`: one descriptor's answer.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct DescriptorStatus {
    /// Within the limit or over it.
    #[prost(enumeration = "Code", tag = "1")]
    pub code: i32,
    /// The limit that applied, if one did.
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<RateLimit>,
    /// What is left of it.
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    /// Until the limit's window starts again.
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<Duration>,
}

/// `RateLimitResponse.RateLimit`: a limit, as the answer names it.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct RateLimit {
    /// The limit's name.
    #[prost(string, tag = "3")]
    pub name: String,
    /// Requests a unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// `RateLimitResponse.RateLimit.Unit`, as [`sluice_core::rls::Unit::proto`] writes it.
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `RateLimitResponse.Code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, prost::Enumeration)]
#[repr(i32)]
pub enum Code {
    /// No answer.
    Unknown = 0,
    /// Within the limit.
    Ok = 1,
    /// Over the limit.
    OverLimit = 2,
}

/// `envoy.config.core.v3.HeaderValue`: a header's name and value.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct HeaderValue {
    /// The name.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `ShouldRateLimit`, as a service answers it.
#[tonic::async_trait]
pub trait RateLimitService: Send + Sync + 'static {
    /// One call.
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status>;
}

/// `ShouldRateLimit`.
pub struct ShouldRateLimit;

impl method::Method for ShouldRateLimit {
    const PATH: &'static str = SHOULD_RATE_LIMIT;
}

impl<S: RateLimitService> method::Serve<S> for ShouldRateLimit {
    fn serve<B: method::RequestBody>(
        service: Arc<S>,
        request: http::Request<B>,
    ) -> method::BoxFuture<method::Answer, Infallible> {
        Box::pin(async move { Ok(method::server().unary(Unary(service), request).await) })
    }
}

/// A [`RateLimitService`] as a gRPC service, ready to route.
pub type RateLimitServer<S> = method::Server<ShouldRateLimit, S>;

/// A client of the rate limit service.
pub type RateLimitClient = method::Client<ShouldRateLimit>;

impl RateLimitClient {
    /// One `ShouldRateLimit` call.
    pub async fn should_rate_limit(
        &mut self,
        request: impl tonic::IntoRequest<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let (channel, path) = self.ready().await?;
        let codec = tonic_prost::ProstCodec::default();
        channel.unary(request.into_request(), path, codec).await
    }
}

/// One call, to the service.
struct Unary<S>(Arc<S>);

impl<S: RateLimitService> tonic::server::UnaryService<RateLimitRequest> for Unary<S> {
    type Response = RateLimitResponse;
    type Future = method::BoxFuture<tonic::Response<RateLimitResponse>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let service = Arc::clone(&self.0);
        Box::pin(async move { service.should_rate_limit(request).await })
    }
}
