//! Deciding one request: its checks, in order, each one script call.

use std::sync::Arc;

use sluice_core::key::redis_key;
use sluice_core::record;
use sluice_core::verdict::Verdict;
use sluice_core::wire::{DecideRequest, DecideResponse};

use crate::metrics::Metrics;
use crate::scripts::{BatchCall, ScriptCall};
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
        let calls: Vec<(ScriptCall, bool)> = request
            .checks
            .iter()
            .map(|check| {
                let key = redis_key(
                    &self.key_prefix,
                    &check.rule,
                    &check.key,
                    check.limit.algorithm(),
                );
                (
                    ScriptCall::new(&check.limit, key, now_us, check.cost, check.count_denied),
                    check.shadow,
                )
            })
            .collect();
        let results = if calls.len() > 1 && self.store.runs_batches() {
            // One round trip, and the whole request decided atomically.
            self.store
                .run_batch(&BatchCall::new(calls))
                .await
                .inspect_err(|e| self.metrics.redis_error(e))?
        } else {
            // Check by check (on a Cluster each key may live on another node).
            let mut results: Vec<Verdict> = Vec::with_capacity(calls.len());
            let mut denied = false;
            for (mut call, shadow) in calls {
                if denied {
                    call = call.looking();
                }
                let verdict = self
                    .store
                    .run(&call)
                    .await
                    .inspect_err(|e| self.metrics.redis_error(e))?;
                denied |= !verdict.allowed && !shadow;
                results.push(verdict);
            }
            results
        };
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
