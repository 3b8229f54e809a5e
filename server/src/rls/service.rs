//! The gRPC service: `ShouldRateLimit` from protobuf to [`RlsRequest`] and from [`Answer`]
//! back.

use std::sync::Arc;

use http::HeaderMap;
use sluice_core::rls::answer::{Answer, Code};
use sluice_core::rls::request::{LimitOverride, RlsDescriptor, RlsRequest};
use tonic::{Request, Response, Status};

use crate::app_state::AppState;
use crate::clock;
use crate::envoy_api::protobuf::Duration as ProtoDuration;
use crate::envoy_api::ratelimit::{
    Code as ProtoCode, DescriptorStatus, HeaderValue, RateLimit, RateLimitDescriptor,
    RateLimitRequest, RateLimitResponse, RateLimitServer, RateLimitService,
};
use crate::inbound::{authorize, replay_time};

use super::RlsError;

/// `envoy.service.ratelimit.v3.RateLimitService` over the server's state.
#[derive(Clone)]
pub struct RlsService {
    state: Arc<AppState>,
}

/// The gRPC service, ready to route.
pub fn rate_limit_service(state: Arc<AppState>) -> RateLimitServer<RlsService> {
    RateLimitServer::new(RlsService { state })
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        should_rate_limit(&self.state, &metadata.into_headers(), request)
            .await
            .map(Response::new)
    }
}

/// One `ShouldRateLimit` call, by whichever way it came in: through tonic, or taken before the
/// router ([`super::unary`]).
pub(crate) async fn should_rate_limit(
    state: &AppState,
    headers: &HeaderMap,
    request: RateLimitRequest,
) -> Result<RateLimitResponse, Status> {
    let started = clock::monotonic();
    let Some(rls) = &state.rls else {
        return Err(Status::unimplemented(
            "this server has no rate limit configuration: start it with --rls-config",
        ));
    };
    authorize(state, headers).map_err(Status::unauthenticated)?;
    let replay_us = replay_time(state, headers).map_err(Status::invalid_argument)?;
    let request = from_proto(request);
    if let Some(log) = &rls.descriptor_log {
        log.record(&request);
    }
    let answer = rls
        .decide(&state.engine, &state.metrics, &request, replay_us)
        .await;
    state.metrics.rls().call(started.elapsed());
    match answer {
        Ok(answer) => Ok(to_proto(answer)),
        Err(RlsError::Request(e)) => {
            tracing::debug!(error = %e, "bad rate limit request");
            Err(Status::invalid_argument(e.to_string()))
        }
        Err(RlsError::Store(e)) => {
            let warning = &state.failure_warnings.should_rate_limit;
            if let Some(left_out) = warning.due(clock::monotonic()) {
                tracing::warn!(error = %e, left_out, "rate limit decision failed");
            }
            Err(Status::unavailable(e.to_string()))
        }
    }
}

fn from_proto(request: RateLimitRequest) -> RlsRequest {
    RlsRequest {
        domain: request.domain,
        descriptors: request.descriptors.into_iter().map(descriptor).collect(),
        hits_addend: request.hits_addend,
    }
}

fn descriptor(descriptor: RateLimitDescriptor) -> RlsDescriptor {
    RlsDescriptor {
        entries: descriptor
            .entries
            .into_iter()
            .map(|e| (e.key, e.value))
            .collect(),
        limit: descriptor.limit.map(|l| LimitOverride {
            requests_per_unit: l.requests_per_unit,
            unit: l.unit,
        }),
        hits_addend: descriptor.hits_addend.map(|h| h.value),
        is_negative_hits: descriptor.is_negative_hits,
    }
}

fn code(code: Code) -> i32 {
    match code {
        Code::Ok => ProtoCode::Ok as i32,
        Code::OverLimit => ProtoCode::OverLimit as i32,
    }
}

fn to_proto(answer: Answer) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code(answer.overall_code),
        statuses: answer
            .statuses
            .into_iter()
            .map(|s| DescriptorStatus {
                code: code(s.code),
                current_limit: s.current_limit.map(|l| RateLimit {
                    name: l.name,
                    requests_per_unit: l.requests_per_unit,
                    unit: l.unit.proto(),
                }),
                limit_remaining: s.limit_remaining,
                duration_until_reset: s.until_reset_ms.map(|ms| ProtoDuration {
                    seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
                    // Below 1e9, so it fits.
                    nanos: i32::try_from(ms % 1000 * 1_000_000).unwrap_or(0),
                }),
            })
            .collect(),
        response_headers_to_add: answer
            .headers
            .into_iter()
            .map(|(key, value)| HeaderValue { key, value })
            .collect(),
    }
}
