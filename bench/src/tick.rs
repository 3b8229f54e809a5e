//! The lease tick at scale: the filter logic's tick over thousands of leased keys, as the
//! native module runs it (its settings, one worker's leases over an in-memory store with
//! Envoy's CAS semantics), beside a request's take in the same pass. In the module every
//! worker's take waits on the lock the tick holds, so a tick's length is a stall of requests.
//!
//! Each pass: every key's first requests at one instant (each marks its key's ask), ticks a
//! millisecond apart until every ask has gone out and been granted (a burst of new keys), then
//! ticks 20 ms apart while every key holds its lease and none is due a look (the steady state).
//! Time is virtual for the leases; only the work is timed. Beside it, every core taking from
//! leased keys at once ([`contention`]).

use std::fmt::Write as _;
use std::rc::Rc;
use std::time::{Duration, Instant};

use sluice_core::policy::Policy;
use sluice_filter_logic::shared_data::MemorySharedData;

use crate::spread::spread;

pub mod contention;
mod setup;

use setup::{POLICY, grant_each, key_of, leased_rule, module_leases};

/// Keys in each setting.
pub const KEYS: [usize; 2] = [1_000, 20_000];
/// Passes of each setting.
pub const PASSES: usize = 5;
/// Requests each key makes at the start.
const TAKES_A_KEY: usize = 3;
/// Ticks in the steady state.
const STEADY_TICKS: usize = 25;
/// Granted leases outlast the measured span: no look comes due for a lease's end.
const LEASE_MS: u64 = 60_000;
const MS: u64 = 1_000;

/// One pass's figures, in µs.
#[derive(Debug, Clone, Copy)]
pub struct Pass {
    /// A request's take of a key not yet leased (it marks the key's ask), on average.
    pub take_us: f64,
    /// Ticks until every key's ask had gone out.
    pub burst_ticks: usize,
    /// Those ticks together.
    pub burst_total_us: f64,
    /// Their median.
    pub burst_median_us: f64,
    /// The longest of them.
    pub burst_longest_us: f64,
    /// A tick with every key leased and none due a look: the median of the steady ticks.
    pub steady_us: f64,
}

/// `PASSES` passes on each of [`KEYS`].
pub fn run() -> anyhow::Result<Vec<(usize, Vec<Pass>)>> {
    let policy = Policy::from_json(POLICY.as_bytes())?;
    KEYS.iter()
        .map(|&keys| {
            // The first pass of a process pays for its memory's first use.
            pass(&policy, keys)?;
            let passes = (0..PASSES)
                .map(|i| {
                    eprintln!(
                        "bench: the lease tick on {keys} keys, pass {} of {PASSES} ...",
                        i + 1
                    );
                    pass(&policy, keys)
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            Ok((keys, passes))
        })
        .collect()
}

fn pass(policy: &Policy, keys: usize) -> anyhow::Result<Pass> {
    let (rule, config) = leased_rule(policy)?;
    let worker = module_leases(Rc::new(MemorySharedData::default()), policy);
    let tenants = (0..keys)
        .map(|k| key_of(policy, k))
        .collect::<anyhow::Result<Vec<_>>>()?;

    let mut now = 10_000 * MS;
    let started = Instant::now();
    for _ in 0..TAKES_A_KEY {
        for key in &tenants {
            worker.take(0, rule, config, key, now);
        }
    }
    let take_us = micros(started.elapsed()) / (TAKES_A_KEY * keys) as f64;

    let mut burst = Vec::new();
    let mut asked = 0;
    while asked < keys {
        anyhow::ensure!(
            burst.len() < 4 * keys,
            "{asked} of {keys} keys asked for after {} ticks",
            burst.len()
        );
        now += MS;
        let started = Instant::now();
        let call = worker.on_tick(&policy.rules, now);
        if let Some((request, sent)) = call {
            asked += request.asks.len();
            let grants = grant_each(&request.asks, |ask| ask.want, LEASE_MS);
            worker.sent(1, sent);
            worker.answered(1, Ok(grants), |_, _| {});
        }
        burst.push(micros(started.elapsed()));
    }

    let mut steady = Vec::with_capacity(STEADY_TICKS);
    for _ in 0..STEADY_TICKS {
        now += 20 * MS;
        let started = Instant::now();
        let call = worker.on_tick(&policy.rules, now);
        steady.push(micros(started.elapsed()));
        anyhow::ensure!(
            call.is_none(),
            "a steady tick asked: {:?}",
            call.map(|c| c.0)
        );
    }
    Ok(Pass {
        take_us,
        burst_ticks: burst.len(),
        burst_total_us: burst.iter().sum(),
        burst_longest_us: burst.iter().copied().fold(0.0, f64::max),
        burst_median_us: spread(burst).0,
        steady_us: spread(steady).0,
    })
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `figure` of every pass: its median and range.
fn of_passes(passes: &[Pass], figure: impl Fn(&Pass) -> f64) -> (f64, f64, f64) {
    spread(passes.iter().map(figure).collect())
}

/// The section of BENCHMARKS.md: the tick's `results` and the takes at once of `contention`.
pub fn section(
    results: &[(usize, Vec<Pass>)],
    contention: &[(usize, Vec<f64>)],
) -> anyhow::Result<String> {
    let mut out = String::new();
    writeln!(
        out,
        "The filter logic's lease tick as the native module runs it (its settings; one worker's leases over an in-memory store with Envoy's CAS semantics; the release build), on {} and {} keys, {PASSES} passes each; each cell the median with the range in brackets. In the module every worker's take waits on the lock a tick holds: a tick's length is a stall of requests. Each setting's first pass is not counted (it pays for its memory's first use). Each pass: every key's first {TAKES_A_KEY} requests at one instant (each key's first marks its ask), then ticks a millisecond apart, each call answered at once, until every key's ask has gone out (*burst*); then {STEADY_TICKS} ticks 20 ms apart with every key leased and no lease due a look (*steady*). *Take*: a request's take of a key not yet leased, the baseline of the same pass.\n",
        KEYS[0], KEYS[1]
    )?;
    writeln!(
        out,
        "| keys | take µs | burst: ticks | burst: all ticks ms | burst: median tick µs | burst: longest tick µs | longest tick / take | steady tick µs | steady tick / take |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|")?;
    let cell = |(mid, lo, hi): (f64, f64, f64), digits: usize| {
        format!("{mid:.digits$} [{lo:.digits$} .. {hi:.digits$}]")
    };
    for (keys, passes) in results {
        writeln!(
            out,
            "| {keys} | {} | {} | {} | {} | {} | {} | {} | {} |",
            cell(of_passes(passes, |p| p.take_us), 2),
            cell(of_passes(passes, |p| p.burst_ticks as f64), 0),
            cell(of_passes(passes, |p| p.burst_total_us / 1e3), 1),
            cell(of_passes(passes, |p| p.burst_median_us), 0),
            cell(of_passes(passes, |p| p.burst_longest_us), 0),
            cell(of_passes(passes, |p| p.burst_longest_us / p.take_us), 0),
            cell(of_passes(passes, |p| p.steady_us), 2),
            cell(of_passes(passes, |p| p.steady_us / p.take_us), 2),
        )?;
    }
    if let [(few, few_passes), (many, many_passes)] = results {
        let ratio = |p: &[Pass]| of_passes(p, |p| p.steady_us).0;
        writeln!(
            out,
            "\nA steady tick on {many} keys costs {:.2} times one on {few}: a tick looks at the leases due, not at every lease.",
            ratio(many_passes) / ratio(few_passes)
        )?;
    }
    writeln!(
        out,
        "\nEvery worker's leased request takes the module's one lock once. Takes of {} leased hot keys as the module makes them (its leases behind its lock, its allowances in process memory), {} a thread in a tight loop, on one thread and then on one a core, all at once; {} passes each after one not counted, each cell the median with the range in brackets. With every core taking at once, the lock moves between cores on every take: the rate in all is about what the lock can serve a whole Envoy on this machine, however many workers take.\n\n{}",
        contention::KEYS,
        contention::TAKES,
        contention::PASSES,
        contention::rows(contention)
    )?;
    Ok(out)
}
