//! The Lua scripts against the reference models, on a real redis-server.
//!
//! For every algorithm, random limits (up to a billion units, windows and periods up to 30
//! days, so that products pass 2^53 and the scripts' exact `muldivmod` is exercised) and random
//! request sequences (times from 2020 to 2096 that jump forwards and backwards, costs from 0 to
//! beyond the capacity, counted denials or not) are decided by the script (replay time) and by
//! the model. Every field of every verdict must be equal, and so must the state: the value
//! Redis holds is read back and compared with the model's state. Before some steps the script
//! is only asked (`commit` off): it must answer as the model does and write nothing.
//!
//! Every answer must also be possible for its limit ([`Verdict::check_against`], which the
//! filter holds every answer to) and wait no longer than [`Limit::longest_wait_ms`] beyond the
//! caller's lag (the filter's deny cache keeps a denial no longer than that).
//!
//! The batch script is held to [`decide_all`], the all-or-nothing rule, the same way.
//!
//! Steps take turns between the two ways the server calls a script, as a function of its
//! library (`FCALL`) and as a script (`EVALSHA`), on the same keys: both must answer as the
//! model does, from the state the other left.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis::aio::MultiplexedConnection;
use sluice_core::algorithm::{CheckInput, Request, State, Update, decide_all};
use sluice_core::limit::{Algorithm, Limit, MAX_LOG_ENTRIES};
use sluice_core::verdict::Verdict;
use sluice_harness::RedisServer;
use sluice_server::scripts::{BatchCall, ScriptCall, ScriptTime};
use sluice_server::store::{ScriptCalls, Store, Topology};

/// Sequences per algorithm.
const CASES: u32 = 400;

fn duration() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("1ms".to_owned()),
        Just("7ms".to_owned()),
        Just("1s".to_owned()),
        Just("3s".to_owned()),
        Just("1m".to_owned()),
        Just("1d".to_owned()),
        Just("30d".to_owned()),
        (1u64..=2_592_000_000).prop_map(|ms| format!("{ms}ms")),
    ]
}

fn amount() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 1u64..=12,
        1 => Just(49u64),
        1 => Just(1_000_000u64),
        1 => 1u64..=1_000_000_000,
    ]
}

fn limit_strategy(algorithm: Algorithm) -> BoxedStrategy<Limit> {
    let json = match algorithm {
        // Small limits fill with the drawn costs; the largest one takes costs of any size.
        Algorithm::SlidingLog => (
            prop_oneof![4 => 1u64..=30, 1 => Just(MAX_LOG_ENTRIES), 1 => 1..=MAX_LOG_ENTRIES],
            duration(),
        )
            .prop_map(|(limit, window)| {
                format!(r#"{{"algorithm":"sliding_log","limit":{limit},"window":"{window}"}}"#)
            })
            .boxed(),
        Algorithm::FixedWindow | Algorithm::SlidingWindow => (amount(), duration())
            .prop_map(move |(limit, window)| {
                format!(r#"{{"algorithm":"{algorithm}","limit":{limit},"window":"{window}"}}"#)
            })
            .boxed(),
        Algorithm::TokenBucket | Algorithm::Gcra => (amount(), duration(), amount())
            .prop_map(move |(rate, per, burst)| {
                format!(r#"{{"algorithm":"{algorithm}","rate":{rate},"per":"{per}","burst":{burst}}}"#)
            })
            .boxed(),
        Algorithm::LeakyBucket => (amount(), duration(), amount(), prop::option::of(duration()))
            .prop_map(|(rate, per, burst, max_wait)| {
                let shaping = max_wait
                    .map(|w| format!(r#","mode":"shaping","max_wait":"{w}""#))
                    .unwrap_or_default();
                format!(
                    r#"{{"algorithm":"leaky_bucket","rate":{rate},"per":"{per}","burst":{burst}{shaping}}}"#
                )
            })
            .boxed(),
    };
    // Buckets that would take over 3650 days to fill are refused by validation: skip them.
    json.prop_filter_map("a limit the parser accepts", |json| {
        serde_json::from_str::<Limit>(&json).ok()
    })
    .boxed()
}

/// A step: microseconds to move the clock (negative: a caller whose clock lags), a cost drawn
/// relative to the capacity (`None`: 1), and whether to ask first without consuming.
type Step = (i64, Option<u64>, bool);

fn steps() -> impl Strategy<Value = (i64, Vec<Step>, bool)> {
    let dt = prop_oneof![
        6 => Just(0i64),
        6 => 1i64..2_000,
        4 => 1i64..2_000_000,
        2 => -500_000i64..0,
        2 => 1i64..3_000_000_000,
        1 => 1i64..3_000_000_000_000,
    ];
    let cost = prop_oneof![8 => Just(None), 3 => any::<u64>().prop_map(Some)];
    let step = (dt, cost, prop::bool::weighted(0.25));
    (
        1_600_000_000_000_000i64..4_000_000_000_000_000,
        prop::collection::vec(step, 1..40),
        any::<bool>(),
    )
}

/// A drawn cost: 0 to 3 most often, otherwise up to one beyond the capacity.
fn cost_of(drawn: Option<u64>, capacity: u64) -> u64 {
    match drawn {
        None => 1,
        Some(c) if c % 3 == 0 => c % (capacity + 2),
        Some(c) => c % 4,
    }
}

/// The state as the scripts store it, or `None` for an absent key.
fn stored_form(state: &State) -> Option<String> {
    Some(match state {
        State::FixedWindow(s) => format!("{}:{}", s.window, s.count),
        State::SlidingWindow(s) => format!("{}:{}:{}", s.window, s.current, s.previous),
        State::TokenBucket(s) | State::LeakyBucket(s) | State::Gcra(s) if s.frac == 0 => {
            s.us.to_string()
        }
        State::TokenBucket(s) | State::LeakyBucket(s) | State::Gcra(s) => {
            format!("{}:{}", s.us, s.frac)
        }
        State::SlidingLog(s) if s.entries.is_empty() => return None,
        State::SlidingLog(s) => s
            .entries
            .iter()
            .map(|e| format!("{}:{:016}/{}", e.at_us, e.end, e.units))
            .collect::<Vec<_>>()
            .join(","),
    })
}

/// What Redis holds at `key`, in [`stored_form`].
async fn stored(
    redis: &mut MultiplexedConnection,
    key: &str,
    algorithm: Algorithm,
) -> Option<String> {
    if algorithm == Algorithm::SlidingLog {
        let entries: Vec<(String, i64)> = redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(redis)
            .await
            .unwrap();
        if entries.is_empty() {
            return None;
        }
        let entries: Vec<String> = entries
            .iter()
            .map(|(member, at)| format!("{at}:{member}"))
            .collect();
        Some(entries.join(","))
    } else {
        redis::cmd("GET").arg(key).query_async(redis).await.unwrap()
    }
}

struct Redis {
    server: RedisServer,
    runtime: tokio::runtime::Runtime,
    /// Calling scripts as functions, and by `EVALSHA`.
    stores: [Arc<Store>; 2],
    raw: MultiplexedConnection,
}

impl Redis {
    fn start() -> Redis {
        let server = RedisServer::start().expect("redis-server");
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let topology = Topology::Standalone(server.url());
        let stores = [ScriptCalls::Functions, ScriptCalls::Eval].map(|calls| {
            runtime.block_on(common::connected_store_calling(topology.clone(), calls))
        });
        let raw = runtime.block_on(async {
            redis::Client::open(server.url())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap()
        });
        Redis {
            server,
            runtime,
            stores,
            raw,
        }
    }

    /// The store for step `step`: each way of calling in turn.
    fn store(&self, step: usize) -> &Arc<Store> {
        &self.stores[step % 2]
    }

    fn run(
        &self,
        step: usize,
        call: &ScriptCall,
    ) -> Result<sluice_core::verdict::Verdict, TestCaseError> {
        self.runtime
            .block_on(self.store(step).run(call))
            .map_err(|e| TestCaseError::fail(e.to_string()))
    }

    /// Both ways of calling were used: neither fell back to the other.
    fn assert_both_ways_ran(&self) {
        assert!(
            self.stores[0].calls_functions(),
            "the functions store fell back to EVALSHA"
        );
        assert!(common::calls(&self.server, "fcall") > 0, "no FCALL ran");
        assert!(common::calls(&self.server, "evalsha") > 0, "no EVALSHA ran");
    }

    fn stored(&self, key: &str, algorithm: Algorithm) -> Option<String> {
        let mut raw = self.raw.clone();
        self.runtime.block_on(stored(&mut raw, key, algorithm))
    }
}

/// An answer any caller could be given: possible for its limit (capacity, remaining, delay),
/// and waits no longer than the limit's longest, plus what this caller's clock lags behind
/// the latest time the key has seen.
fn assert_possible(
    verdict: &Verdict,
    limit: &Limit,
    lag_us: i64,
    context: &str,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(verdict.check_against(limit), Ok(()), "{}", context);
    let longest = limit.longest_wait_ms() + u64::try_from(lag_us).unwrap_or(0).div_ceil(1000);
    prop_assert!(
        verdict.reset_ms <= longest,
        "reset_ms over {}, {}",
        longest,
        context
    );
    prop_assert!(
        verdict.retry_after_ms.unwrap_or(0) <= longest,
        "retry_after_ms over {}, {}",
        longest,
        context
    );
    Ok(())
}

fn apply(state: &mut Option<State>, update: Update<State>) {
    if let Update::Write { state: s, .. } = update {
        *state = Some(s);
    }
}

fn check_algorithm(algorithm: Algorithm) {
    let redis = Redis::start();
    let sequence = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(
        &(limit_strategy(algorithm), steps()),
        |(limit, (start, steps, count_denied))| {
            let key = format!("diff:{algorithm}:{}", sequence.fetch_add(1, Ordering::Relaxed));
            let mut now = start;
            let mut latest = start;
            let mut state: Option<State> = None;
            for (i, &(dt, drawn, ask_first)) in steps.iter().enumerate() {
                now += dt;
                latest = latest.max(now);
                let cost = cost_of(drawn, limit.capacity());
                let request = Request {
                    now_us: now,
                    cost,
                    count_denied,
                };
                let model = limit.decide(state.as_ref(), request);
                let call = ScriptCall::new(&limit, key.clone(), ScriptTime::Replay(now), cost, count_denied);
                let context = format!(
                    "step {i} of {steps:?} (limit {limit:?}, start {start}, cost {cost}, count_denied {count_denied}, now {now})"
                );
                if ask_first {
                    let before = redis.stored(&key, algorithm);
                    let asked = redis.run(i, &call.asking())?;
                    prop_assert_eq!(asked, model.verdict, "asking, {}", context);
                    assert_possible(&asked, &limit, latest - now, &context)?;
                    prop_assert_eq!(redis.stored(&key, algorithm), before, "asking wrote, {}", context);
                }
                let script = redis.run(i + 1, &call)?;
                prop_assert_eq!(script, model.verdict, "{}", context);
                assert_possible(&script, &limit, latest - now, &context)?;
                apply(&mut state, model.update);
                let expected = state.as_ref().and_then(stored_form);
                prop_assert_eq!(redis.stored(&key, algorithm), expected, "stored state, {}", context);
            }
            Ok(())
        },
    );
    if let Err(e) = result {
        panic!("{algorithm}: script and model disagree: {e}");
    }
    redis.assert_both_ways_ran();
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

/// Multi-check requests: the batch script against [`decide_all`], check by check and state by
/// state.
#[test]
fn the_batch_script_decides_all_or_nothing_as_the_models_do() {
    let redis = Redis::start();
    let sequence = AtomicU64::new(0);
    let algorithm = prop::sample::select(Algorithm::ALL.to_vec());
    let rules = prop::collection::vec(algorithm.prop_flat_map(limit_strategy), 1..5);
    let shadows = prop::collection::vec(any::<bool>(), 4);
    let costs = prop::collection::vec(prop::option::weighted(0.8, Just(())), 4);
    let mut runner = TestRunner::new(Config {
        cases: 300,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(
        &(rules, shadows, costs, steps()),
        |(limits, shadows, same_cost, (start, steps, count_denied))| {
            let prefix = format!("batch:{}", sequence.fetch_add(1, Ordering::Relaxed));
            let keys: Vec<String> = (0..limits.len()).map(|c| format!("{prefix}:{c}")).collect();
            let mut now = start;
            let mut latest = start;
            let mut states: Vec<Option<State>> = vec![None; limits.len()];
            for (i, &(dt, drawn, _)) in steps.iter().enumerate() {
                now += dt;
                latest = latest.max(now);
                // Most checks cost the step's cost; some cost 1.
                let costs: Vec<u64> = limits
                    .iter()
                    .zip(&same_cost)
                    .map(|(l, same)| if same.is_some() { cost_of(drawn, l.capacity()) } else { 1 })
                    .collect();
                let calls: Vec<(ScriptCall, bool)> = limits
                    .iter()
                    .enumerate()
                    .map(|(c, limit)| {
                        let call = ScriptCall::new(limit, keys[c].clone(), ScriptTime::Replay(now), costs[c], count_denied);
                        (call, shadows[c])
                    })
                    .collect();
                let script = redis
                    .runtime
                    .block_on(redis.store(i).run_batch(&BatchCall::new(ScriptTime::Replay(now), calls)))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let inputs: Vec<CheckInput<'_>> = limits
                    .iter()
                    .enumerate()
                    .map(|(c, limit)| CheckInput {
                        limit,
                        state: states[c].as_ref(),
                        cost: costs[c],
                        count_denied,
                        shadow: shadows[c],
                    })
                    .collect();
                let model = decide_all(&inputs, now);
                for (c, out) in model.into_iter().enumerate() {
                    let context = format!(
                        "step {i} check {c} of {limits:?} (shadows {shadows:?}, costs {costs:?}, count_denied {count_denied}, now {now})"
                    );
                    prop_assert_eq!(script[c], out.verdict, "{}", context);
                    assert_possible(&script[c], &limits[c], latest - now, &context)?;
                    apply(&mut states[c], out.update);
                    let expected = states[c].as_ref().and_then(stored_form);
                    let algorithm = limits[c].algorithm();
                    prop_assert_eq!(redis.stored(&keys[c], algorithm), expected, "stored state, {}", context);
                }
            }
            Ok(())
        },
    );
    if let Err(e) = result {
        panic!("batch script and models disagree: {e}");
    }
    redis.assert_both_ways_ran();
}
