//! Deciding one request: every check, all or nothing.
//!
//! A request that an enforced check denies consumes nothing from any rule (the contract:
//! [`sluice_core::algorithm::decide_all`]). With one Redis (standalone or behind Sentinel) the
//! batch script decides the whole request atomically. On a Redis Cluster a request's keys live
//! on several nodes, so no script sees them all: the engine decides in two phases, [`probe`]
//! (ask every enforced check but the last, consuming nothing) and [`settle`] (consume, or
//! decide the denial). Between the two, another request may take the last units of a key the
//! probe found room in. The request is then denied in the second phase, but the checks that
//! phase already consumed stay consumed: at most the request's cost on each of its other
//! rules, once per such race. `docs/algorithms.md` states the bound; the engine counts each
//! race in `sluice_split_decision_races_total`.
//!
//! [`probe`]: Engine::probe
//! [`settle`]: Engine::settle

use std::sync::Arc;

use futures::future::try_join_all;
use sluice_core::key::redis_key;
use sluice_core::record;
use sluice_core::verdict::Verdict;
use sluice_core::wire::{
    Check, DecideRequest, DecideResponse, LeaseAsk, LeaseRequest, LeaseResponse,
};

use crate::clock::RedisClock;
use crate::metrics::Metrics;
use crate::scripts::{BatchCall, LeaseCall, LeaseReply, ScriptCall, ScriptTime};
use crate::store::{Store, StoreError};

/// Why a lease request got no grants.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Redis failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An ask named a holder whose entry in that key's ledger another secret bound.
    #[error(
        "asks[{ask}]: holder `{holder}` holds this key's lease under another secret: send the secret its first ask sent, or take another holder name"
    )]
    Stranger {
        /// The holder named.
        holder: String,
        /// The ask's index in the request.
        ask: usize,
    },
}

/// Decides requests against the store.
pub struct Engine {
    store: Arc<Store>,
    key_prefix: String,
    metrics: Arc<Metrics>,
    clock: Arc<RedisClock>,
}

/// A Cluster decision after its first phase: what each enforced check but the last answered
/// when asked. [`Engine::settle`] finishes it.
#[derive(Debug)]
pub struct Probe {
    /// Each check's call and whether it is a shadow check.
    calls: Vec<(ScriptCall, bool)>,
    /// The answers of the checks that were asked.
    asked: Vec<Option<Verdict>>,
    /// The last enforced check, which is not asked: it consumes first in the second phase.
    last_enforced: Option<usize>,
}

impl Probe {
    /// Whether an enforced check already denied the request.
    pub fn blocked(&self) -> bool {
        self.asked.iter().flatten().any(|v| !v.allowed)
    }
}

impl Engine {
    /// An engine writing keys under `key_prefix`, on Redis' clock as the server carries it
    /// ([`RedisClock`], read in the background while the store lives).
    pub fn new(store: Arc<Store>, key_prefix: String, metrics: Arc<Metrics>) -> Engine {
        let clock = Arc::new(RedisClock::default());
        clock.keep_reading(Arc::downgrade(&store));
        Engine {
            store,
            key_prefix,
            metrics,
            clock,
        }
    }

    /// The time of a call: the replay's when it gives one, else Redis' clock.
    pub fn time(&self, replay_us: Option<i64>) -> ScriptTime {
        match replay_us {
            Some(us) => ScriptTime::Replay(us),
            None => self.clock.script_time(),
        }
    }

    /// The time now (µs since the epoch): the replay's when it gives one, else Redis' clock as
    /// carried; `None` before the clock's first reading.
    pub fn now_us(&self, replay_us: Option<i64>) -> Option<i64> {
        replay_us.or_else(|| self.clock.now_us(crate::clock::monotonic()))
    }

    /// Redis' clock as this server carries it.
    pub fn clock(&self) -> &RedisClock {
        &self.clock
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Decides every check of `request`, all or nothing. `replay_us` is the replay time, when
    /// the server accepts one.
    pub async fn decide(
        &self,
        request: &DecideRequest,
        replay_us: Option<i64>,
    ) -> Result<DecideResponse, StoreError> {
        let time = self.time(replay_us);
        let calls = self.calls(request, time);
        let results = async {
            match calls.len() {
                1 => Ok(vec![self.store.run(&calls[0].0).await?]),
                _ if self.store.runs_batches() => {
                    self.store.run_batch(&BatchCall::new(time, calls)).await
                }
                _ => {
                    let probe = self.probe(calls).await?;
                    self.settle(probe).await
                }
            }
        }
        .await
        .inspect_err(|e| self.metrics.redis_error(e))?;
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

    /// Whether a decision succeeds now, as `/readyz` asks: one real decision on a key of its
    /// own (a fixed window of a billion a second, rule `sluice-server.readyz`), which needs
    /// Redis connected, the scripts runnable and writes accepted (a Redis out of memory still
    /// answers PING but refuses them). It is counted in no decision metric.
    pub async fn ready(&self) -> Result<(), StoreError> {
        let check: Check = serde_json::from_str(
            r#"{"rule": "sluice-server.readyz", "key": "probe",
                "limit": {"algorithm": "fixed_window", "limit": 1000000000, "window": "1s"}}"#,
        )
        .map_err(|e| StoreError::NotConnected(format!("the readiness check: {e}")))?;
        let request = DecideRequest {
            checks: vec![check],
        };
        let calls = self.calls(&request, self.time(None));
        let (call, _) = calls
            .first()
            .ok_or_else(|| StoreError::NotConnected("the readiness check made no call".into()))?;
        self.store.run(call).await.map(drop)
    }

    /// Grants the asks of one lease request (see [`sluice_core::lease`]): in one call of the
    /// lease script on one Redis, one call per key on a Cluster (each ask touches one key and
    /// its ledger, which share a hash tag, so each call is atomic).
    pub async fn lease(
        &self,
        request: &LeaseRequest,
        replay_us: Option<i64>,
    ) -> Result<LeaseResponse, LeaseError> {
        let time = self.time(replay_us);
        let state_key = |ask: &sluice_core::wire::LeaseAsk| {
            redis_key(&self.key_prefix, &ask.rule, &ask.key, &ask.limit)
        };
        let call = |asks: &[LeaseAsk]| {
            LeaseCall::new(
                time,
                &request.holder,
                &request.secret,
                asks.iter().map(|ask| (ask, state_key(ask))),
            )
        };
        // One call on one Redis; on a Cluster one per ask, each atomic on its own key.
        let per_call = if self.store.runs_batches() {
            request.asks.len()
        } else {
            1
        };
        let replies = try_join_all(request.asks.chunks(per_call).map(|asks| {
            let call = call(asks);
            async move { self.store.run_lease(&call).await }
        }))
        .await
        .inspect_err(|e| self.metrics.redis_error(e))?;
        let mut grants = Vec::with_capacity(request.asks.len());
        for (chunk, reply) in replies.into_iter().enumerate() {
            match reply {
                LeaseReply::Granted(granted) => grants.extend(granted),
                LeaseReply::Stranger(i) => {
                    self.metrics.lease_stranger();
                    return Err(LeaseError::Stranger {
                        holder: request.holder.clone(),
                        ask: chunk * per_call + i,
                    });
                }
            }
        }
        for (ask, grant) in request.asks.iter().zip(&grants) {
            self.metrics.lease(ask, grant);
        }
        Ok(LeaseResponse { grants })
    }

    /// Each check's script call at `time`, consuming, with whether it is a shadow check.
    pub fn calls(&self, request: &DecideRequest, time: ScriptTime) -> Vec<(ScriptCall, bool)> {
        request
            .checks
            .iter()
            .map(|check| {
                let key = redis_key(&self.key_prefix, &check.rule, &check.key, &check.limit);
                (
                    ScriptCall::new(&check.limit, key, time, check.cost, check.count_denied),
                    check.shadow,
                )
            })
            .collect()
    }

    /// The first phase of a decision across Cluster nodes: asks every enforced check but the
    /// last whether it admits, all at once, consuming nothing.
    pub async fn probe(&self, calls: Vec<(ScriptCall, bool)>) -> Result<Probe, StoreError> {
        let last_enforced = calls.iter().rposition(|(_, shadow)| !shadow);
        let asking = calls
            .iter()
            .enumerate()
            .map(|(i, (call, shadow))| async move {
                if *shadow || Some(i) == last_enforced {
                    Ok(None)
                } else {
                    self.store.run(&call.asking()).await.map(Some)
                }
            });
        let asked = try_join_all(asking).await?;
        Ok(Probe {
            calls,
            asked,
            last_enforced,
        })
    }

    /// The second phase: when no enforced check denied, the last enforced check consumes, and
    /// if it admits, every other check does, all at once. When one denied, each check that
    /// denies is decided as a denial and each that admits is asked at cost 0.
    pub async fn settle(&self, probe: Probe) -> Result<Vec<Verdict>, StoreError> {
        let mut blocked = probe.blocked();
        let Probe {
            calls,
            asked,
            last_enforced,
        } = probe;
        let mut settled: Vec<Option<Verdict>> = vec![None; calls.len()];
        if let Some(last) = last_enforced
            && !blocked
        {
            let verdict = self.store.run(&calls[last].0).await?;
            blocked = !verdict.allowed;
            settled[last] = Some(verdict);
        }
        let pending =
            calls
                .iter()
                .zip(&asked)
                .zip(&settled)
                .map(|((call, asked), settled)| async move {
                    if let Some(verdict) = settled {
                        return Ok(*verdict);
                    }
                    let (call, _) = call;
                    if !blocked {
                        return self.store.run(call).await;
                    }
                    let answer = match asked {
                        Some(verdict) => *verdict,
                        None => self.store.run(&call.asking()).await?,
                    };
                    let cost = if answer.allowed { 0 } else { call.cost };
                    self.store.run(&call.at_cost(cost)).await
                });
        let verdicts = try_join_all(pending).await?;
        let denied_now = calls
            .iter()
            .zip(&verdicts)
            .any(|((_, shadow), v)| !shadow && !v.allowed);
        if !blocked && denied_now {
            // Another request took a key's last units between the phases; the checks that
            // admitted in this phase have consumed.
            self.metrics.split_decision_race();
        }
        Ok(verdicts)
    }
}
