//! Envoy's Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`), for Envoy's native
//! `rate_limit_quota` filter: what each bucket gets ([`sluice_core::rlqs`]), configured by the
//! files [`config`] loads, from reports [`report`] checks, on one [`stream`] per Envoy.

pub mod action;
pub mod config;
pub mod report;
pub mod service;
pub mod stats;
pub mod stream;

use std::sync::Arc;
use std::time::Duration;

use self::config::WatchedConfig;

/// What the quota service adds to the server's state.
#[derive(Debug)]
pub struct RlqsState {
    /// The configuration in force.
    pub config: Arc<WatchedConfig>,
    /// How often the configuration's files are checked for changes.
    pub poll: Duration,
}
