//! Deciding one request: its checks, in order, each one script call.

use std::sync::Arc;

use sluice_core::key::redis_key;
use sluice_core::record;
use sluice_core::verdict::Verdict;
use sluice_core::wire::{DecideRequest, DecideResponse};

use crate::metrics::Metrics;
use crate::scripts::ScriptCall;
use crate::store::{Store, StoreError};

/// Decides requests against the store.
pub struct Engine {
    store: Arc<Store>,
    key_prefix: String,
    metrics: Arc<Metrics>,
}

impl Engine {
    /// An engine writing keys under `key_prefix`.
    pub fn new(store: Arc<Store>, key_prefix: String, metrics: Arc<Metrics>) -> Engine {
        Engine {
            store,
            key_prefix,
            metrics,
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Decides every check of `request`, in order. Once an enforced check is denied, the
    /// request is denied, and the checks after it are asked at cost 0: a denied request
    /// consumes nothing more. `now_us` is the replay time, when the server accepts one.
    pub async fn decide(
        &self,
        request: &DecideRequest,
        now_us: Option<i64>,
    ) -> Result<DecideResponse, StoreError> {
        let mut results: Vec<Verdict> = Vec::with_capacity(request.checks.len());
        let mut denied = false;
        for check in &request.checks {
            let cost = if denied { 0 } else { check.cost };
            let key = redis_key(
                &self.key_prefix,
                &check.rule,
                &check.key,
                check.limit.algorithm(),
            );
            let call = ScriptCall::new(&check.limit, key, now_us, cost, check.count_denied);
            let verdict = self
                .store
                .run(&call)
                .await
                .inspect_err(|e| self.metrics.redis_error(e))?;
            denied |= !verdict.allowed && !check.shadow;
            results.push(verdict);
        }
        let outcomes = record::outcomes(
            request
                .checks
                .iter()
                .zip(&results)
                .map(|(c, v)| (c.shadow, v.allowed)),
        );
        for (check, outcome) in request.checks.iter().zip(outcomes) {
            self.metrics.decision(check.rule.as_str(), outcome.name());
        }
        Ok(DecideResponse { results })
    }
}
