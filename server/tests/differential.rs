//! The Lua scripts against the reference models, on a real redis-server.
//!
//! For every algorithm, random limits and random request sequences (times that jump forwards
//! and backwards, costs from 0 to beyond the capacity, counted denials or not) are decided by
//! the script (replay time) and by the model; every field of every verdict must be equal, and
//! the model's state must say the key exists exactly when Redis has it.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a broken expectation is a failed test

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sluice_core::algorithm::{Request, State, Update};
use sluice_core::limit::{Algorithm, Limit};
use sluice_harness::RedisServer;
use sluice_server::scripts::ScriptCall;
use sluice_server::store::{Store, Topology};

/// Sequences per algorithm.
const CASES: u32 = 500;

fn limit_strategy(algorithm: Algorithm) -> BoxedStrategy<Limit> {
    let window = prop_oneof![
        Just("1ms"),
        Just("7ms"),
        Just("100ms"),
        Just("1s"),
        Just("1m"),
        Just("3s")
    ];
    let per = prop_oneof![
        Just("1ms"),
        Just("3ms"),
        Just("1s"),
        Just("7s"),
        Just("1m"),
        Just("1d")
    ];
    match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow => (1u64..=12, window)
            .prop_map(move |(limit, window)| {
                common::limit(&format!(r#"{{"algorithm":"{algorithm}","limit":{limit},"window":"{window}"}}"#))
            })
            .boxed(),
        Algorithm::TokenBucket | Algorithm::Gcra => (1u64..=20, per, 1u64..=12)
            .prop_map(move |(rate, per, burst)| {
                common::limit(&format!(
                    r#"{{"algorithm":"{algorithm}","rate":{rate},"per":"{per}","burst":{burst}}}"#
                ))
            })
            .boxed(),
        Algorithm::LeakyBucket => (1u64..=20, per, 1u64..=12, prop::option::of(prop_oneof![Just("1ms"), Just("250ms"), Just("2s")]))
            .prop_map(|(rate, per, burst, max_wait)| {
                let shaping = max_wait.map(|w| format!(r#","mode":"shaping","max_wait":"{w}""#)).unwrap_or_default();
                common::limit(&format!(
                    r#"{{"algorithm":"leaky_bucket","rate":{rate},"per":"{per}","burst":{burst}{shaping}}}"#
                ))
            })
            .boxed(),
    }
}

/// A step: microseconds to move the clock (negative: a caller whose clock lags), a cost.
fn steps() -> impl Strategy<Value = (Vec<(i64, u64)>, bool)> {
    let dt = prop_oneof![
        6 => Just(0i64),
        6 => 1i64..2_000,
        4 => 1i64..2_000_000,
        2 => -500_000i64..0,
        1 => 1i64..200_000_000,
    ];
    let cost = prop_oneof![8 => Just(1u64), 2 => 0u64..=3, 1 => 0u64..=30];
    (prop::collection::vec((dt, cost), 1..40), any::<bool>())
}

fn check_algorithm(algorithm: Algorithm) {
    let redis = RedisServer::start().expect("redis-server");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let store: Arc<Store> =
        runtime.block_on(common::connected_store(Topology::Standalone(redis.url())));
    let sequence = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(
        &(limit_strategy(algorithm), steps()),
        |(limit, (steps, count_denied))| {
            let key = format!(
                "diff:{algorithm}:{}",
                sequence.fetch_add(1, Ordering::Relaxed)
            );
            // A start time near today's, so float magnitudes are those of production.
            let mut now: i64 = 1_763_700_000_000_000;
            let mut state: Option<State> = None;
            for (i, (dt, cost)) in steps.iter().enumerate() {
                now += dt;
                let request = Request {
                    now_us: now,
                    cost: *cost,
                    count_denied,
                };
                let model = limit.decide(state.as_ref(), request);
                let call = ScriptCall::new(&limit, key.clone(), Some(now), *cost, count_denied);
                let script = runtime
                    .block_on(store.run(&call))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(
                    script,
                    model.verdict,
                    "step {} of {:?} (limit {:?}, count_denied {}, now {})",
                    i,
                    steps,
                    limit,
                    count_denied,
                    now
                );
                if let Update::Write { state: s, .. } = model.update {
                    state = Some(s);
                }
            }
            Ok(())
        },
    );
    if let Err(e) = result {
        panic!("{algorithm}: script and model disagree: {e}");
    }
}

#[test]
fn fixed_window_script_matches_model() {
    check_algorithm(Algorithm::FixedWindow);
}

#[test]
fn sliding_log_script_matches_model() {
    check_algorithm(Algorithm::SlidingLog);
}

#[test]
fn sliding_window_script_matches_model() {
    check_algorithm(Algorithm::SlidingWindow);
}

#[test]
fn token_bucket_script_matches_model() {
    check_algorithm(Algorithm::TokenBucket);
}

#[test]
fn leaky_bucket_script_matches_model() {
    check_algorithm(Algorithm::LeakyBucket);
}

#[test]
fn gcra_script_matches_model() {
    check_algorithm(Algorithm::Gcra);
}

/// Multi-check requests: the batch script against the models, applying the protocol's rule
/// that once an enforced check is denied, the checks after it only look (cost 0).
#[test]
fn the_batch_script_matches_the_models_check_by_check() {
    use sluice_server::scripts::BatchCall;
    let redis = RedisServer::start().expect("redis-server");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let store: Arc<Store> =
        runtime.block_on(common::connected_store(Topology::Standalone(redis.url())));
    let sequence = AtomicU64::new(0);
    let algorithm = prop::sample::select(Algorithm::ALL.to_vec());
    let rules = prop::collection::vec(algorithm.prop_flat_map(limit_strategy), 1..5);
    let shadows = prop::collection::vec(any::<bool>(), 4);
    let mut runner = TestRunner::new(Config {
        cases: 300,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(
        &(rules, shadows, steps()),
        |(limits, shadows, (steps, count_denied))| {
            let prefix = format!("batch:{}", sequence.fetch_add(1, Ordering::Relaxed));
            let mut now: i64 = 1_763_700_000_000_000;
            let mut states: Vec<Option<State>> = vec![None; limits.len()];
            for (i, (dt, cost)) in steps.iter().enumerate() {
                now += dt;
                let calls: Vec<(ScriptCall, bool)> = limits
                    .iter()
                    .enumerate()
                    .map(|(c, limit)| {
                        (
                            ScriptCall::new(
                                limit,
                                format!("{prefix}:{c}"),
                                Some(now),
                                *cost,
                                count_denied,
                            ),
                            shadows[c],
                        )
                    })
                    .collect();
                let batch = BatchCall::new(calls);
                let script = runtime
                    .block_on(store.run_batch(&batch))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let mut denied = false;
                for (c, limit) in limits.iter().enumerate() {
                    let request = Request {
                        now_us: now,
                        cost: if denied { 0 } else { *cost },
                        count_denied,
                    };
                    let model = limit.decide(states[c].as_ref(), request);
                    prop_assert_eq!(
                        script[c],
                        model.verdict,
                        "step {} check {} of {:?}",
                        i,
                        c,
                        limits
                    );
                    if let Update::Write { state, .. } = model.update {
                        states[c] = Some(state);
                    }
                    denied |= !model.verdict.allowed && !shadows[c];
                }
            }
            Ok(())
        },
    );
    if let Err(e) = result {
        panic!("batch script and models disagree: {e}");
    }
}
