//! The real-Envoy section of BENCHMARKS.md: a table per key spread, the start-up times, the
//! lease's bound and the bars the issue set, each judged on every round.

use std::fmt::Write as _;
use std::path::Path;

use sluice_sim::report::charts;

use super::plan::{
    CONNECTIONS, Keys, Results, Run, START_UPS_A_ROUND, TURN_WARMUP, WORKERS, limit,
};
use super::setup::{SERVER_THREADS, Setup};
use crate::chart_dir::ChartDir;

mod instructions;
mod judge;
mod lease;

use judge::{plain, ratio_bar, spread, verdict, verdict_where_judged, within_multiple};
use lease::{calls_bar, module_lease_bars, rate_bar};

/// The chart of Envoy's added CPU.
const CHART: &str = "envoy-cpu.svg";
/// The largest .wasm the filter may be.
const MAX_WASM_BYTES: u64 = 400 * 1024;

impl Results {
    fn runs(&self, keys: Keys, setup: Setup) -> &[Run] {
        self.runs
            .iter()
            .find(|(k, s, _)| (*k, *s) == (keys, setup))
            .map_or(&[], |(_, _, runs)| runs.as_slice())
    }

    /// Per round, `f` of `setup`'s run and the same round's run of `baseline`.
    fn paired(
        &self,
        keys: Keys,
        setup: Setup,
        baseline: Setup,
        f: impl Fn(&Run, &Run) -> f64,
    ) -> Vec<f64> {
        self.runs(keys, setup)
            .iter()
            .zip(self.runs(keys, baseline))
            .map(|(run, base)| f(run, base))
            .collect()
    }

    /// Whether the run measured every one of `setups` in its rounds: `--only` may leave some
    /// out, and a bar that needs them is then left unwritten rather than shown with figures
    /// that are not there.
    fn measured(&self, setups: &[Setup]) -> bool {
        setups
            .iter()
            .all(|setup| !self.runs(Keys::Hot, *setup).is_empty())
    }

    /// Whether the run started Envoy with every one of `setups`.
    fn started(&self, setups: &[Setup]) -> bool {
        setups
            .iter()
            .all(|setup| self.start_ups.iter().any(|(s, _)| s == setup))
    }

    /// Envoy's CPU µs a request added by `setup` over no filter, per round.
    fn envoy_added_us(&self, keys: Keys, setup: Setup) -> Vec<f64> {
        self.paired(keys, setup, Setup::NoFilter, |run, base| {
            run.cpu_us_per_request()[0] - base.cpu_us_per_request()[0]
        })
    }
}

/// The section, in Markdown.
pub fn section(
    results: &Results,
    wasm: &Path,
    envoy_version: &str,
    charts: ChartDir,
) -> anyhow::Result<String> {
    let mut out = String::new();
    let rounds = results.runs.first().map_or(0, |(_, _, r)| r.len());
    if rounds == 0 {
        // `--rounds 0 --instructions`: the counts alone.
        instructions::section(&mut out, results)?;
        return Ok(out);
    }
    writeln!(
        out,
        "Envoy {envoy_version} (V8) with {WORKERS} worker, started afresh every round with a listener for each setup below; every listener's route goes to a further listener of the same Envoy answering 200 itself. The load generator holds {CONNECTIONS} keep-alive HTTP/1.1 connections (closed loop, one thread) to one listener at a time, each request carrying `x-api-key` from 10 hot keys or 1,000 keys in turn. sluice-server is the release binary with one thread (sleeping when idle, its default), gRPC on the same port; Redis beside it; all on this machine's cores. Each limit is high enough that everything passes, except the denying row's. {rounds} rounds; in each, every setup on each key spread takes {turns} turns of {:.1} s, each after {} ms of warm-up on its listener, in an order that moves by one every pass, so that a slow stretch of the machine weighs on every setup alike; a setup's figures in a round are over all its turns, and each cell is the median over the rounds, ranges in brackets. CPU from `/proc` (Envoy's whole process, sluice-server's) and Redis' `INFO`, over the measured turns, divided by the requests answered in them; *added* is Envoy's CPU a request over the same round's no-filter turns. *Calls*: requests Envoy sent sluice-server during the turns (its clusters' `upstream_rq_total`).\n",
        results.seconds as f64 / results.turns as f64,
        TURN_WARMUP.as_millis(),
        turns = results.turns,
    )?;
    for keys in [Keys::Hot, Keys::Many] {
        table(&mut out, results, keys)?;
    }
    let chart = charts.write(CHART, chart(results))?;
    writeln!(out, "![Envoy CPU a request added]({chart})\n")?;
    start_up(&mut out, results)?;
    over_limit(&mut out, results)?;
    bars(&mut out, results, wasm)?;
    instructions::section(&mut out, results)?;
    out.push_str(WHERE_THE_TIME_GOES);
    Ok(out)
}

/// Where Envoy's time goes, as perf showed it; written once in `bench/notes/`, with the
/// history in `docs/performance-log.md`.
const WHERE_THE_TIME_GOES: &str = include_str!("../../notes/envoy.md");

fn table(out: &mut String, results: &Results, keys: Keys) -> anyhow::Result<()> {
    writeln!(
        out,
        "**{} keys**\n\n| setup | requests/s | vs no filter | p50 ms | p99 ms | Envoy µs a request | Envoy µs added | sluice-server µs | Redis µs | calls per 1,000 requests |\n|---|---|---|---|---|---|---|---|---|---|",
        keys.count()
    )?;
    for (k, setup, runs) in &results.runs {
        if *k != keys {
            continue;
        }
        let of = |f: &dyn Fn(&Run) -> f64| spread(runs.iter().map(f).collect());
        let rate = of(&|r| r.measured.answered_rate());
        let relative = spread(results.paired(keys, *setup, Setup::NoFilter, |run, base| {
            run.measured.answered_rate() / base.measured.answered_rate()
        }));
        let added = spread(results.envoy_added_us(keys, *setup));
        let cpu = |i: usize| of(&|r| r.cpu_us_per_request()[i]);
        writeln!(
            out,
            "| {} | {:.0} | {:.2} [{:.2} .. {:.2}] | {:.3} | {:.3} | {:.1} | {:.1} [{:.1} .. {:.1}] | {:.1} | {:.1} | {:.0} |",
            setup.name(),
            rate.0,
            relative.0,
            relative.1,
            relative.2,
            of(&|r| r.measured.quantile_ms(0.5)).0,
            of(&|r| r.measured.quantile_ms(0.99)).0,
            cpu(0).0,
            added.0,
            added.1,
            added.2,
            cpu(1).0,
            cpu(2).0,
            of(&|r| r.calls_per_1000()).0,
        )?;
    }
    writeln!(out)?;
    Ok(())
}

fn chart(results: &Results) -> String {
    let setups: Vec<Setup> = Setup::COMPARED
        .into_iter()
        .filter(|s| *s != Setup::NoFilter)
        .collect();
    let categories: Vec<String> = setups.iter().map(|s| s.name().replace('`', "")).collect();
    let stacks: Vec<charts::Stack> = [(Keys::Hot, "10 hot keys"), (Keys::Many, "1,000 keys")]
        .into_iter()
        .map(|(keys, label)| charts::Stack {
            segments: vec![(
                label,
                setups
                    .iter()
                    .map(|s| spread(results.envoy_added_us(keys, *s)).0.max(0.0))
                    .collect(),
            )],
        })
        .collect();
    charts::stacked_bars(
        "Envoy CPU a request added over no filter",
        "µs a request",
        &categories,
        &stacks,
    )
}

fn start_up(out: &mut String, results: &Results) -> anyhow::Result<()> {
    writeln!(
        out,
        "From Envoy's start to its `/ready` with each setup's filters alone (ms; median over {} starts of each, {} a round). Before Envoy is ready V8 compiles every function of the module with TurboFan (proxy-wasm turns Liftoff off), on Envoy's main thread and one V8 worker thread (the only `V8 DefaultWorker` of the process, 240 ms of CPU by the time Envoy was ready): in Envoy's debug log, from `Base Wasm created` to the module's `_initialize`, sluice's module (354 KB of code) took 266 to 319 ms, the no-op's (79 KB) 63 to 70, the probe filter's (271 KB) 138 to 145 (three runs each, 2026-12-04). No one function makes it slow: node 20's V8 on one thread (`new WebAssembly.Module` timed with `--single-threaded --no-liftoff --no-wasm-dynamic-tiering --no-wasm-lazy-compilation`, each function's share with `--trace-wasm-compilation-times`) compiles the three in 323, 72 and 202 ms, and sluice's largest function (17 KB) in 23 ms, its ten largest in about 85 ms, 785 of its 838 in under 1 ms each: the time is spread over the whole module, of which the configuration's serde code (tracking the path that names a bad field) is about a fifth and `regex_lite` a twelfth. With a worker per core (two) node compiles them in 160, 38 and 127 ms, near its figures of 2026-11-26 (121, 36 and 123): Envoy's V8, with its one worker, compiles sluice's module about as fast as node's on one thread.\n\n| setup | start to ready ms |\n|---|---|",
        results
            .start_ups
            .first()
            .map_or(0, |(_, times)| times.len()),
        START_UPS_A_ROUND,
    )?;
    // In the order the bars read them; `--only` may have started some of them alone.
    for setup in [
        Setup::NoFilter,
        Setup::Noop,
        Setup::Sluice,
        Setup::NoopModule,
        Setup::SluiceModule,
    ] {
        if results.started(&[setup]) {
            writeln!(
                out,
                "| {} | {:.0} |",
                setup.name(),
                start_up_ms(results, setup)
            )?;
        }
    }
    writeln!(out)?;
    Ok(())
}

fn start_up_ms(results: &Results, setup: Setup) -> f64 {
    let times = results
        .start_ups
        .iter()
        .find(|(s, _)| *s == setup)
        .map_or(&[][..], |(_, times)| times.as_slice());
    spread(times.iter().map(|t| t.as_secs_f64() * 1e3).collect()).0
}

fn over_limit(out: &mut String, results: &Results) -> anyhow::Result<()> {
    if results.over_limit.is_empty() {
        // `--only` named no way in over a limit.
        return Ok(());
    }
    writeln!(
        out,
        "**Three ways in, over a limit.** The 10 hot keys, each limited to `{}`, offered as fast as the load generator goes from Envoy's first request, through each way into sluice-server. *Exact* is what the algorithm alone admits at most (each key's burst and its rate over the span); each way's bound is the one docs/algorithms.md states.\n\n| way in | s | requests/s | messages to sluice-server per 1,000 requests | admitted | of exact | bound | kept |\n|---|---|---|---|---|---|---|---|",
        limit()
    )?;
    for o in &results.over_limit {
        writeln!(
            out,
            "| {} | {:.1} | {:.0} | {:.2} | {} | {:.3} | {} | {} |",
            o.setup.name(),
            o.seconds,
            o.rate(),
            o.messages_per_1000(),
            o.admitted,
            o.admitted as f64 / o.exact as f64,
            o.bound,
            if o.admitted <= o.bound {
                "yes"
            } else {
                "**no**"
            },
        )?;
    }
    writeln!(out)?;
    Ok(())
}

/// sluice-server's CPU a decision under `setup` over under `base`, round by round.
fn server_cpu_ratios(results: &Results, keys: Keys, setup: Setup, base: Setup) -> Vec<f64> {
    results.paired(keys, setup, base, |run, base| {
        run.cpu_us_per_request()[1] / base.cpu_us_per_request()[1]
    })
}

/// Where the per-request floor module (what any module that asks a server per request asks of
/// Envoy) stands against the native filter, round by round, and what sluice's module adds over
/// it: whether the bar of 0.8 sits above what any such module costs.
fn per_request_floor(out: &mut String, results: &Results, keys: Keys) -> anyhow::Result<()> {
    let floor = results.envoy_added_us(keys, Setup::CalloutFloorModule);
    let native = results.envoy_added_us(keys, Setup::NativeGrpc);
    let module = results.envoy_added_us(keys, Setup::SluiceModule);
    if floor.is_empty() || native.is_empty() || module.is_empty() {
        return Ok(());
    }
    let of_native: Vec<f64> = floor.iter().zip(&native).map(|(f, n)| f / n).collect();
    let under_bar = of_native.iter().filter(|r| **r <= 0.8).count();
    let over_floor: Vec<f64> = module.iter().zip(&floor).map(|(m, f)| m - f).collect();
    let (ratio, low, high) = spread(of_native.clone());
    let (own, own_low, own_high) = spread(over_floor);
    writeln!(
        out,
        "- Its floor, the {} on {} keys, adds {:.1} µs, {ratio:.2} [{low:.2} .. {high:.2}] times the native filter's, at most 0.8 of it in {under_bar} of {} rounds; sluice's module adds {own:.1} [{own_low:.1} .. {own_high:.1}] µs over that floor.",
        Setup::CalloutFloorModule.name(),
        keys.count(),
        spread(floor).0,
        of_native.len(),
    )?;
    Ok(())
}

fn bars(out: &mut String, results: &Results, wasm: &Path) -> anyhow::Result<()> {
    writeln!(out, "The bars, judged on every round:\n")?;
    // The key spreads a bar on both is judged on: none where the run left out a setup it needs.
    let spreads = |setups: &[Setup]| -> &[Keys] {
        if results.measured(setups) {
            &[Keys::Hot, Keys::Many]
        } else {
            &[]
        }
    };
    for &keys in spreads(&[Setup::NoFilter, Setup::Sluice, Setup::NativeGrpc]) {
        let sluice = results.envoy_added_us(keys, Setup::Sluice);
        let native = results.envoy_added_us(keys, Setup::NativeGrpc);
        let met: Vec<bool> = sluice.iter().zip(&native).map(|(s, n)| s <= n).collect();
        writeln!(
            out,
            "- {} keys: Envoy CPU added by sluice's filter at most the native `ratelimit` filter's: {:.1} µs against {:.1} — {}.",
            keys.count(),
            spread(sluice).0,
            spread(native).0,
            verdict(&met)
        )?;
    }
    for &keys in spreads(&[Setup::NoFilter, Setup::SluiceModule, Setup::NativeGrpc]) {
        let module = results.envoy_added_us(keys, Setup::SluiceModule);
        let native = results.envoy_added_us(keys, Setup::NativeGrpc);
        let met: Vec<bool> = module
            .iter()
            .zip(&native)
            .map(|(m, n)| *m <= 0.8 * n)
            .collect();
        writeln!(
            out,
            "- {} keys: Envoy CPU added by sluice's module at most 0.8 times the native `ratelimit` filter's: {:.1} µs against {:.1} — {}.",
            keys.count(),
            spread(module).0,
            spread(native).0,
            verdict(&met)
        )?;
        per_request_floor(out, results, keys)?;
    }
    if results.measured(&[Setup::NoFilter, Setup::SluiceLease, Setup::Noop]) {
        rate_bar(out, results, Setup::SluiceLease, Setup::Noop, 0.9)?;
        let lease = results.envoy_added_us(Keys::Hot, Setup::SluiceLease);
        let noop = results.envoy_added_us(Keys::Hot, Setup::Noop);
        let met: Vec<Option<bool>> = lease
            .iter()
            .zip(&noop)
            .map(|(l, n)| within_multiple(*l, 2.0, *n))
            .collect();
        writeln!(
            out,
            "- Lease mode on hot keys, Envoy CPU added at most twice the no-op filter's: {:.1} µs against {:.1} — {}.",
            spread(lease).0,
            spread(noop).0,
            verdict_where_judged(&met, "the no-op filter")
        )?;
    }
    if results.measured(&[Setup::SluiceLease]) {
        calls_bar(out, results, "Lease mode", Setup::SluiceLease, 50, 0)?;
    }
    module_lease_bars(out, results)?;
    if results.measured(&[Setup::SluiceThreads, Setup::Sluice]) {
        ratio_bar(
            out,
            &format!(
                "sluice-server with {SERVER_THREADS} threads, at most 1.3 times its CPU a decision with 1, on 1,000 keys"
            ),
            &server_cpu_ratios(results, Keys::Many, Setup::SluiceThreads, Setup::Sluice),
            1.3,
            2,
        )?;
    }
    for &keys in spreads(&[Setup::NativeGrpc, Setup::Sluice]) {
        // Each from Envoy's own client over HTTP/2, a decision a request: the native filter's
        // `ShouldRateLimit` against the wasm filter's `/v1/decide`.
        ratio_bar(
            out,
            &format!(
                "{} keys: sluice-server's CPU a decision for Envoy's gRPC `ShouldRateLimit` at most 1.2 times its CPU for the filter's `/v1/decide`",
                keys.count()
            ),
            &server_cpu_ratios(results, keys, Setup::NativeGrpc, Setup::Sluice),
            1.2,
            2,
        )?;
    }
    let bytes = std::fs::metadata(wasm)?.len();
    writeln!(
        out,
        "- The .wasm at most {} KB: {:.0} KB — {}.",
        MAX_WASM_BYTES / 1024,
        bytes as f64 / 1024.0,
        plain(bytes <= MAX_WASM_BYTES)
    )?;
    if results.started(&[Setup::Sluice, Setup::Noop]) {
        start_up_bar(
            out,
            results,
            "Envoy's start to ready with sluice's filter at most twice the no-op filter's",
            (Setup::Sluice, Setup::Noop),
            2.0,
        )?;
    }
    if results.started(&[Setup::SluiceModule, Setup::NoFilter]) {
        start_up_bar(
            out,
            results,
            "Envoy's start to ready with sluice's module at most 1.2 times with no filter",
            (Setup::SluiceModule, Setup::NoFilter),
            1.2,
        )?;
    }
    left_out(out, results)?;
    writeln!(out)?;
    Ok(())
}

/// Where the run left out setups (`--only`), a line naming them: their bars are not judged.
fn left_out(out: &mut String, results: &Results) -> std::fmt::Result {
    let missing: Vec<String> = Setup::COMPARED
        .into_iter()
        .filter(|setup| !results.measured(&[*setup]))
        .map(|setup| setup.name())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "- Not judged: the bars on setups this run left out ({}).",
        missing.join("; ")
    )
}

/// A bar on `setup`'s start to ready at most `times` its `baseline`'s.
fn start_up_bar(
    out: &mut String,
    results: &Results,
    bar: &str,
    (setup, baseline): (Setup, Setup),
    times: f64,
) -> anyhow::Result<()> {
    let (ms, base_ms) = (start_up_ms(results, setup), start_up_ms(results, baseline));
    writeln!(
        out,
        "- {bar}: {ms:.0} ms against {base_ms:.0} ({:.2} times) — {}.",
        ms / base_ms,
        plain(ms <= times * base_ms)
    )?;
    Ok(())
}

#[cfg(test)]
mod tests;
