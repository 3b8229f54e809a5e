//! Envoy's gRPC API, the part sluice speaks: the rate limit service
//! (`envoy.service.ratelimit.v3`, [`ratelimit`]) and the quota service
//! (`envoy.service.rate_limit_quota.v3`, [`quota`]): their messages, with every field sluice
//! reads or writes under Envoy's field number, their paths, and each service's client and
//! server side.
//!
//! Written from Envoy 1.40's `.proto` files (`api/envoy/service/ratelimit/v3/rls.proto`,
//! `service/rate_limit_quota/v3/rlqs.proto`, `type/v3/ratelimit_strategy.proto`,
//! `type/v3/token_bucket.proto`, `type/v3/ratelimit_unit.proto`,
//! `extensions/common/ratelimit/v3/ratelimit.proto`, `config/core/v3/base.proto`) rather than
//! taken from a crate that generates all of Envoy's API: that crate was 41.5 s of the 641 s of
//! CPU a cold build of the demo took, for the two dozen messages used here
//! (docs/performance-log.md). A field left out here is skipped when a message is decoded, as
//! protobuf skips any field its reader does not know; the tests through Envoy 1.40 hold the
//! rest.

mod method;
pub mod protobuf;
pub mod quota;
pub mod ratelimit;
