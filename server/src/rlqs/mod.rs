//! Envoy's Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`), for Envoy's native
//! `rate_limit_quota` filter: what each bucket gets ([`sluice_core::rlqs`]), configured by the
//! files [`config`] loads, from reports [`report`] checks.

pub mod config;
pub mod report;
