//! Every algorithm against an exact rational-arithmetic model, at real epoch times.
//!
//! The models here are written from each algorithm's textbook definition in arbitrary-precision
//! rationals: tokens and a refill time for the token bucket, a level and a drain time for the
//! leaky bucket, the theoretical arrival time for GCRA, a weighted estimate for the sliding
//! window. `sluice-core`'s models must give the same decision, `remaining`, `reset_ms`,
//! `retry_after_ms` and `delay_ms` at every step of random sequences that start between 2020
//! and 2096 (1.6e15 to 4e15 µs, where an `f64` keeps a quarter of a microsecond or less), with
//! costs, repeats at one instant, and callers whose clocks lag.
//!
//! Two properties hold the answers to their meaning, independently of either model: after a
//! denial, the same request passes `retry_after_ms` later and not a millisecond sooner; after
//! any decision, the limit is whole again `reset_ms` later and not a millisecond sooner.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a broken expectation is a failed test

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{Signed, ToPrimitive, Zero};
use proptest::prelude::*;
use proptest::test_runner::Config;
use sluice_core::algorithm::{Request, State, Update};
use sluice_core::limit::Limit;
use sluice_core::verdict::Verdict;

type Q = BigRational;

fn q(n: impl Into<i128>) -> Q {
    Q::from_integer(BigInt::from(n.into()))
}

fn ratio(n: impl Into<i128>, d: impl Into<i128>) -> Q {
    Q::new(BigInt::from(n.into()), BigInt::from(d.into()))
}

/// `floor(x)`, or 0 when negative.
fn floor_units(x: &Q) -> u64 {
    if x.is_negative() {
        0
    } else {
        x.floor().to_integer().to_u64().expect("fits")
    }
}

/// Microseconds to milliseconds, rounded up; 0 when not positive.
fn ceil_ms(us: &Q) -> u64 {
    if !us.is_positive() {
        0
    } else {
        (us / q(1000)).ceil().to_integer().to_u64().expect("fits")
    }
}

fn max(a: Q, b: Q) -> Q {
    if a > b { a } else { b }
}

fn min(a: Q, b: Q) -> Q {
    if a < b { a } else { b }
}

/// One algorithm's textbook model with its state.
enum Model {
    FixedWindow {
        limit: u64,
        window: i64,
        state: Option<(i64, u64)>,
    },
    SlidingLog {
        limit: u64,
        window: i64,
        entries: Vec<i64>,
    },
    SlidingWindow {
        limit: u64,
        window: i64,
        /// (window index, current, previous)
        state: Option<(i64, u64, u64)>,
    },
    /// Tokens and the time they were counted.
    TokenBucket {
        rate: Q,
        burst: u64,
        state: Option<(Q, Q)>,
    },
    /// A level and the time it was measured.
    LeakyBucket {
        rate: Q,
        burst: u64,
        max_wait_us: Option<Q>,
        state: Option<(Q, Q)>,
    },
    /// The theoretical arrival time.
    Gcra {
        interval: Q,
        burst: u64,
        tat: Option<Q>,
    },
}

impl Model {
    fn new(limit: &Limit) -> Model {
        match limit {
            Limit::FixedWindow(w) => Model::FixedWindow {
                limit: w.limit(),
                window: w.window().as_micros(),
                state: None,
            },
            Limit::SlidingLog(w) => Model::SlidingLog {
                limit: w.limit(),
                window: w.window().as_micros(),
                entries: Vec::new(),
            },
            Limit::SlidingWindow(w) => Model::SlidingWindow {
                limit: w.limit(),
                window: w.window().as_micros(),
                state: None,
            },
            // Units per microsecond.
            Limit::TokenBucket(b) => Model::TokenBucket {
                rate: ratio(b.rate(), b.per().as_micros()),
                burst: b.burst(),
                state: None,
            },
            Limit::LeakyBucket(l) => Model::LeakyBucket {
                rate: ratio(l.bucket().rate(), l.bucket().per().as_micros()),
                burst: l.bucket().burst(),
                max_wait_us: l.mode().max_wait().map(|w| q(w.as_micros())),
                state: None,
            },
            Limit::Gcra(b) => Model::Gcra {
                interval: ratio(b.per().as_micros(), b.rate()),
                burst: b.burst(),
                tat: None,
            },
        }
    }

    fn decide(&mut self, now: i64, cost: u64, count_denied: bool) -> Verdict {
        let verdict = |allowed, limit, remaining, reset_ms, retry: Option<u64>| Verdict {
            allowed,
            limit,
            remaining,
            reset_ms,
            retry_after_ms: retry,
            delay_ms: 0,
        };
        match self {
            Model::FixedWindow {
                limit,
                window,
                state,
            } => {
                let cap = *limit;
                let (index, count) = match *state {
                    Some((w, n)) if w >= now.div_euclid(*window) => (w, n),
                    _ => (now.div_euclid(*window), 0),
                };
                let end = q((index + 1) * *window - now);
                let reset = |n: u64| if n > 0 { ceil_ms(&end) } else { 0 };
                if cost > cap {
                    return verdict(false, cap, cap.saturating_sub(count), reset(count), None);
                }
                let allowed = count + cost <= cap;
                let new = if allowed {
                    count + cost
                } else if count_denied {
                    count.max((count + cost).min(2 * cap))
                } else {
                    count
                };
                if new != count {
                    *state = Some((index, new));
                }
                let retry = if allowed { 0 } else { ceil_ms(&end) };
                verdict(
                    allowed,
                    cap,
                    cap.saturating_sub(new),
                    reset(new),
                    Some(retry),
                )
            }
            Model::SlidingLog {
                limit,
                window,
                entries,
            } => {
                let cap = *limit;
                let now = entries.last().map_or(now, |&t| t.max(now));
                entries.retain(|&t| t > now - *window);
                let reset = |e: &[i64]| e.last().map_or(0, |&t| ceil_ms(&q(t + *window - now)));
                let count = entries.len() as u64;
                if cost > cap {
                    return verdict(false, cap, cap - count.min(cap), reset(entries), None);
                }
                let allowed = count + cost <= cap;
                if allowed || count_denied {
                    entries.extend(std::iter::repeat_n(now, cost as usize));
                    let keep = 2 * cap as usize;
                    if !allowed && entries.len() > keep {
                        entries.drain(..entries.len() - keep);
                    }
                }
                let held = entries.len() as u64;
                let retry = if allowed {
                    0
                } else {
                    // The oldest entries leave first; `cost` fits once `held + cost - cap` have.
                    let must_leave = (held + cost - cap) as usize;
                    ceil_ms(&q(entries[must_leave - 1] + *window - now))
                };
                verdict(
                    allowed,
                    cap,
                    cap.saturating_sub(held),
                    reset(entries),
                    Some(retry),
                )
            }
            Model::SlidingWindow {
                limit,
                window,
                state,
            } => {
                let cap = *limit;
                let w = *window;
                let here = now.div_euclid(w);
                let (index, cur, prev) = match *state {
                    Some((i, c, p)) if here <= i => (i, c, p),
                    Some((i, c, _)) if here == i + 1 => (here, 0, c),
                    _ => (here, 0, 0),
                };
                let start = index * w;
                let weight = ratio(w - (now - start).max(0), w);
                let estimate = |c: u64| q(prev) * &weight + q(c);
                let end = q(start + w - now);
                let reset = |c: u64| {
                    if c > 0 {
                        ceil_ms(&(&end + q(w)))
                    } else if prev > 0 {
                        ceil_ms(&end)
                    } else {
                        0
                    }
                };
                if cost > cap {
                    let remaining = floor_units(&(q(cap) - estimate(cur)));
                    return verdict(false, cap, remaining, reset(cur), None);
                }
                let allowed = estimate(cur) + q(cost) <= q(cap);
                let new = if allowed {
                    cur + cost
                } else if count_denied {
                    cur.max((cur + cost).min(2 * cap))
                } else {
                    cur
                };
                if new != cur {
                    *state = Some((index, new, prev));
                }
                let retry = if allowed {
                    Q::zero()
                } else {
                    // The first time the estimate leaves room for `cost`: later in this window
                    // as `prev` fades, or in the next one, where `new` is the previous count.
                    let room = q(cap) - q(new) - q(cost);
                    if !room.is_negative() && prev > 0 {
                        &end - room * q(w) / q(prev)
                    } else if new == 0 {
                        end.clone()
                    } else {
                        let room = q(cap) - q(cost);
                        &end + max(Q::zero(), q(w) - room * q(w) / q(new))
                    }
                };
                let remaining = floor_units(&(q(cap) - estimate(new)));
                verdict(allowed, cap, remaining, reset(new), Some(ceil_ms(&retry)))
            }
            Model::TokenBucket { rate, burst, state } => {
                let full = q(*burst);
                let now_q = q(now);
                let tokens = match state {
                    None => full.clone(),
                    Some((tokens, at)) => min(full.clone(), &*tokens + (&now_q - &*at) * &*rate),
                };
                let wait = |tokens_needed: Q| ceil_ms(&(tokens_needed / &*rate));
                if cost > *burst {
                    let reset = wait(&full - &tokens);
                    return verdict(false, *burst, floor_units(&tokens), reset, None);
                }
                let allowed = tokens >= q(cost);
                let new = if allowed {
                    &tokens - q(cost)
                } else if count_denied {
                    min(tokens.clone(), max(&tokens - q(cost), -full.clone()))
                } else {
                    tokens.clone()
                };
                let retry = if allowed { 0 } else { wait(q(cost) - &new) };
                let v = verdict(
                    allowed,
                    *burst,
                    floor_units(&new),
                    wait(&full - &new),
                    Some(retry),
                );
                if new != tokens {
                    *state = Some((new, now_q));
                }
                v
            }
            Model::LeakyBucket {
                rate,
                burst,
                max_wait_us,
                state,
            } => {
                let size = q(*burst);
                let now_q = q(now);
                let level = match state {
                    None => Q::zero(),
                    Some((level, at)) => max(Q::zero(), &*level - (&now_q - &*at) * &*rate),
                };
                let drain = |level: &Q| level / &*rate;
                if cost > *burst {
                    let remaining = floor_units(&(&size - &level));
                    return verdict(false, *burst, remaining, ceil_ms(&drain(&level)), None);
                }
                let fits = &level + q(cost) <= size;
                let queue = drain(&level);
                let allowed = fits && max_wait_us.as_ref().is_none_or(|w| queue <= *w);
                let new = if allowed {
                    &level + q(cost)
                } else if count_denied {
                    max(level.clone(), min(&level + q(cost), q(2) * &size))
                } else {
                    level.clone()
                };
                let retry = if allowed {
                    0
                } else {
                    let target = match max_wait_us {
                        None => &size - q(cost),
                        Some(w) => min(&size - q(cost), &*w * &*rate),
                    };
                    ceil_ms(&drain(&(&new - target)))
                };
                let mut v = verdict(
                    allowed,
                    *burst,
                    floor_units(&(&size - &new)),
                    ceil_ms(&drain(&new)),
                    Some(retry),
                );
                if allowed && max_wait_us.is_some() {
                    v.delay_ms = ceil_ms(&queue);
                }
                if new != level {
                    *state = Some((new, now_q));
                }
                v
            }
            Model::Gcra {
                interval,
                burst,
                tat,
            } => {
                let now_q = q(now);
                let tolerance = &*interval * q(*burst);
                let excess = tat
                    .as_ref()
                    .map_or(Q::zero(), |t| max(Q::zero(), t - &now_q));
                let remaining = |e: &Q| floor_units(&((&tolerance - e) / &*interval));
                if cost > *burst {
                    return verdict(false, *burst, remaining(&excess), ceil_ms(&excess), None);
                }
                let new = &excess + &*interval * q(cost);
                let allowed = new <= tolerance;
                let kept = if allowed {
                    new
                } else if count_denied {
                    max(excess.clone(), min(new, q(2) * &tolerance))
                } else {
                    excess.clone()
                };
                let retry = if allowed {
                    0
                } else {
                    ceil_ms(&(&kept + &*interval * q(cost) - &tolerance))
                };
                let v = verdict(
                    allowed,
                    *burst,
                    remaining(&kept),
                    ceil_ms(&kept),
                    Some(retry),
                );
                if kept != excess {
                    *tat = Some(now_q + kept);
                }
                v
            }
        }
    }
}

fn apply(state: &mut Option<State>, update: Update<State>) {
    if let Update::Write { state: s, .. } = update {
        *state = Some(s);
    }
}

fn ask(limit: &Limit, state: &Option<State>, now_us: i64, cost: u64) -> Verdict {
    let request = Request {
        now_us,
        cost,
        count_denied: false,
    };
    limit.decide(state.as_ref(), request).verdict
}

/// Durations in milliseconds: the usual ones, odd ones, and anything up to 30 days.
fn duration_ms() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(1u64),
        Just(3),
        Just(7),
        Just(1_000),
        Just(7_000),
        Just(60_000),
        Just(3_600_000),
        Just(86_400_000),
        Just(2_592_000_000),
        1u64..=2_592_000_000,
    ]
}

fn amount(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..=12,
        1 => Just(49u64.min(max)),
        1 => Just(1_000_000u64.min(max)),
        1 => 1u64..=max,
    ]
}

fn limit_json(algorithm: &'static str) -> BoxedStrategy<String> {
    match algorithm {
        "sliding_log" => (1u64..=40, duration_ms())
            .prop_map(|(limit, window)| {
                format!(r#"{{"algorithm":"sliding_log","limit":{limit},"window":"{window}ms"}}"#)
            })
            .boxed(),
        "fixed_window" | "sliding_window" => (amount(1_000_000_000), duration_ms())
            .prop_map(move |(limit, window)| {
                format!(r#"{{"algorithm":"{algorithm}","limit":{limit},"window":"{window}ms"}}"#)
            })
            .boxed(),
        "leaky_bucket" => (
            amount(1_000_000_000),
            duration_ms(),
            amount(1_000_000_000),
            prop::option::of(duration_ms()),
        )
            .prop_map(|(rate, per, burst, max_wait)| {
                let shaping = max_wait
                    .map(|w| format!(r#","mode":"shaping","max_wait":"{w}ms""#))
                    .unwrap_or_default();
                format!(
                    r#"{{"algorithm":"leaky_bucket","rate":{rate},"per":"{per}ms","burst":{burst}{shaping}}}"#
                )
            })
            .boxed(),
        _ => (amount(1_000_000_000), duration_ms(), amount(1_000_000_000))
            .prop_map(move |(rate, per, burst)| {
                format!(
                    r#"{{"algorithm":"{algorithm}","rate":{rate},"per":"{per}ms","burst":{burst}}}"#
                )
            })
            .boxed(),
    }
}

/// A valid limit (buckets that would take over 3650 days to fill are refused, and skipped).
fn limit(algorithm: &'static str) -> impl Strategy<Value = Limit> {
    limit_json(algorithm).prop_filter_map("a limit the parser accepts", |json| {
        serde_json::from_str::<Limit>(&json).ok()
    })
}

/// Steps: microseconds to move the clock (negative: a caller whose clock lags), and a cost
/// drawn relative to the limit's capacity.
fn steps() -> impl Strategy<Value = Vec<(i64, u8, u64)>> {
    let dt = prop_oneof![
        6 => Just(0i64),
        4 => 1i64..2_000,
        4 => 1i64..2_000_000,
        2 => -500_000i64..0,
        2 => 1i64..3_000_000_000,
        1 => 1i64..3_000_000_000_000,
    ];
    // 0: cost 1; 1: a small cost; 2: up to 41; 3: up to the capacity and one beyond.
    let cost = prop_oneof![
        8 => (Just(0u8), Just(1u64)),
        2 => (Just(1u8), 0u64..=3),
        1 => (Just(2u8), any::<u64>()),
        1 => (Just(3u8), any::<u64>()),
    ];
    prop::collection::vec((dt, cost).prop_map(|(dt, (kind, c))| (dt, kind, c)), 1..40)
}

fn check(algorithm: &'static str) {
    let config = Config {
        cases: 400,
        failure_persistence: None,
        ..Config::default()
    };
    proptest!(config, |(
        limit in limit(algorithm),
        start in 1_600_000_000_000_000i64..4_000_000_000_000_000,
        steps in steps(),
        count_denied in any::<bool>(),
    )| {
        let capacity = limit.capacity();
        let mut model = Model::new(&limit);
        let mut state: Option<State> = None;
        let mut now = start;
        let mut latest = i64::MIN;
        for (i, &(dt, kind, c)) in steps.iter().enumerate() {
            now += dt;
            let cost = match kind {
                0 | 1 => c,
                2 => c % (capacity.min(40) + 2),
                _ => c % (capacity + 2),
            };
            let exact = model.decide(now, cost, count_denied);
            let out = limit.decide(state.as_ref(), Request { now_us: now, cost, count_denied });
            prop_assert_eq!(
                out.verdict, exact,
                "step {} at {} cost {} of {:?} (count_denied {})", i, now, cost, limit, count_denied
            );
            apply(&mut state, out.update);
            let on_time = now >= latest;
            latest = latest.max(now);
            if !on_time {
                continue;
            }
            // What the numbers mean, for a caller whose clock does not lag.
            let v = out.verdict;
            if let (false, Some(retry)) = (v.allowed, v.retry_after_ms) {
                let at = now + 1000 * retry as i64;
                prop_assert!(ask(&limit, &state, at, cost).allowed,
                    "step {}: not admitted {} ms later, as retry_after_ms said ({:?})", i, retry, limit);
                if retry > 0 {
                    prop_assert!(!ask(&limit, &state, at - 1000, cost).allowed,
                        "step {}: admitted before retry_after_ms = {} ({:?})", i, retry, limit);
                }
            }
            let whole = ask(&limit, &state, now + 1000 * v.reset_ms as i64, 0);
            prop_assert_eq!(whole.remaining, capacity,
                "step {}: not whole again after reset_ms = {} ({:?})", i, v.reset_ms, limit);
            if v.reset_ms > 0 {
                let before = ask(&limit, &state, now + 1000 * v.reset_ms as i64 - 1000, 0);
                prop_assert!(before.remaining < capacity,
                    "step {}: whole before reset_ms = {} ({:?})", i, v.reset_ms, limit);
            }
        }
    });
}

#[test]
fn fixed_window_is_exact() {
    check("fixed_window");
}

#[test]
fn sliding_log_is_exact() {
    check("sliding_log");
}

#[test]
fn sliding_window_is_exact() {
    check("sliding_window");
}

#[test]
fn token_bucket_is_exact() {
    check("token_bucket");
}

#[test]
fn leaky_bucket_is_exact() {
    check("leaky_bucket");
}

#[test]
fn gcra_is_exact() {
    check("gcra");
}
