//! Envoy's rate limit service API (`envoy.service.ratelimit.v3.RateLimitService`), so that
//! Envoy's native `envoy.filters.http.ratelimit` filter can use sluice-server in place of the
//! reference service, envoyproxy/ratelimit, with the reference's configuration files.
//!
//! - [`config`]: the YAML files, and reloading them when they change.
//! - [`service`]: the gRPC service, from protobuf to [`sluice_core::rls`] and back.
//! - [`cache`]: the local cache of over-limit counters.
//! - [`descriptor_log`]: every call's descriptors, written down when asked.
//! - [`stats`]: the reference's stats names.
//! - [`unary`]: `ShouldRateLimit` answered before the router, the way Envoy calls it.
//!
//! A call is planned in `core` ([`RlsConfig::plan`]), decided by the same [`Engine`] as
//! `/v1/decide` (so all or nothing, on any of the six algorithms), and answered in `core`
//! ([`RlsPlan::answer`]).
//!
//! [`RlsConfig::plan`]: sluice_core::rls::RlsConfig::plan
//! [`RlsPlan::answer`]: sluice_core::rls::request::RlsPlan::answer
//! [`Engine`]: crate::engine::Engine

pub mod cache;
pub mod config;
pub mod descriptor_log;
pub mod service;
pub mod stats;
pub mod unary;

use std::sync::Arc;
use std::time::Duration;

use sluice_core::rls::answer::{Answer, HitCounts, RlsHeaders};
use sluice_core::rls::merged::Merged;
use sluice_core::rls::request::{RlsRequest, RlsRequestError};
use sluice_core::verdict::Verdict;
use sluice_core::wire::DecideRequest;

use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::store::StoreError;

use self::cache::OverLimitCache;
use self::config::WatchedConfig;
use self::descriptor_log::DescriptorLog;
use self::stats::CallError;

/// What the rate limit service adds to the server's state.
#[derive(Debug)]
pub struct RlsState {
    /// The configuration in force.
    pub config: Arc<WatchedConfig>,
    /// Over-limit counters answered without Redis.
    pub cache: OverLimitCache,
    /// Which rate limit headers answers carry.
    pub headers: RlsHeaders,
    /// How often the configuration's files are checked for changes.
    pub poll: Duration,
    /// Where every call's descriptors are written, when asked.
    pub descriptor_log: Option<DescriptorLog>,
}

/// Why a call got no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RlsError {
    /// The request cannot be decided.
    #[error("{0}")]
    Request(#[from] RlsRequestError),
    /// Redis did not answer.
    #[error("{0}")]
    Store(#[from] StoreError),
}

impl RlsError {
    fn kind(&self) -> CallError {
        match self {
            RlsError::Request(_) => CallError::Service,
            RlsError::Store(_) => CallError::Redis,
        }
    }
}

impl RlsState {
    /// The service over a loaded configuration, remembering up to `cache_entries` over-limit
    /// counters.
    pub fn new(
        config: WatchedConfig,
        cache_entries: usize,
        headers: RlsHeaders,
        poll: Duration,
    ) -> RlsState {
        RlsState {
            config: Arc::new(config),
            cache: OverLimitCache::new(cache_entries),
            headers,
            poll,
            descriptor_log: None,
        }
    }

    /// Decides `request`: plans it on the configuration in force, answers what the local cache
    /// knows, decides the rest all or nothing in Redis, and counts the hits.
    pub async fn decide(
        &self,
        engine: &Engine,
        metrics: &Metrics,
        request: &RlsRequest,
        replay_us: Option<i64>,
    ) -> Result<Answer, RlsError> {
        let outcome = self
            .decide_uncounted(engine, metrics, request, replay_us)
            .await;
        if let Err(e) = &outcome {
            metrics.rls().error(e.kind());
        }
        outcome
    }

    async fn decide_uncounted(
        &self,
        engine: &Engine,
        metrics: &Metrics,
        request: &RlsRequest,
        replay_us: Option<i64>,
    ) -> Result<Answer, RlsError> {
        let config = self.config.current();
        let plan = config.plan(request)?;
        let planned: Vec<_> = plan.planned().map(|(_, p)| p).collect();
        let now_us = engine.now_us(replay_us);
        let cached: Vec<Option<Verdict>> = planned
            .iter()
            .map(|p| now_us.and_then(|now| self.cache.get(p.counter_id(), p.check.cost, now)))
            .collect();
        // A request the cache already denies consumes nothing: the others are only asked.
        let denied_by_cache = planned
            .iter()
            .zip(&cached)
            .any(|(p, c)| c.is_some() && !p.check.shadow);
        let checks = planned
            .iter()
            .zip(&cached)
            .filter(|(_, c)| c.is_none())
            .map(|(p, _)| {
                let mut check = p.check.clone();
                if denied_by_cache {
                    check.cost = 0;
                }
                check
            })
            .collect::<Vec<_>>();
        // The same descriptor twice is one counter: asked once, for both (see Merged).
        let mut merged = Merged::of(checks);
        let decided = if merged.checks.is_empty() {
            Vec::new()
        } else {
            let checks = std::mem::take(&mut merged.checks);
            let results = engine
                .decide(&DecideRequest { checks }, replay_us)
                .await?
                .results;
            merged.split(&results).unwrap_or_default()
        };
        let mut decided = decided.into_iter();
        let mut verdicts = Vec::with_capacity(planned.len());
        for (p, cached) in planned.iter().zip(&cached) {
            let verdict = match cached {
                Some(verdict) => *verdict,
                None => {
                    let Some(verdict) = decided.next() else {
                        break;
                    };
                    if let Some(now) = now_us
                        && !denied_by_cache
                    {
                        self.cache
                            .remember(p.counter_id(), p.check.cost, &verdict, now);
                    }
                    verdict
                }
            };
            verdicts.push(verdict);
        }
        let consumed = !denied_by_cache
            && planned
                .iter()
                .zip(&verdicts)
                .all(|(p, v)| v.allowed || p.check.shadow);
        for ((p, verdict), cached) in planned.iter().zip(&verdicts).zip(&cached) {
            let counts = HitCounts::of(p, verdict, consumed, cached.is_some());
            metrics.rls().hits(&p.stats_key, &counts);
        }
        Ok(plan.answer(&verdicts, self.headers))
    }
}
