//! The replay section's rate tables: the simulator through the .wasm, through the model of
//! Envoy's native rate limit filter, and through the model of its quota filter.

use std::fmt::Write as _;

use sluice_sim::trace::synthetic::Kind;

use crate::filter::Modules;
use crate::replay;

/// Where the replay's time goes (see `bench/notes/`).
const REPLAY_TIME_GOES: &str = include_str!("../../notes/replay.md");

/// How many times each trace is replayed through sluice for a rate (here and in the lease
/// section).
pub(super) const REPLAY_RUNS: usize = 3;

pub fn replay_section(modules: &Modules) -> anyhow::Result<String> {
    let mut out = String::new();
    writeln!(
        out,
        "`sluice-sim replay` in virtual time, end to end: the real filter in wasmtime, the server in the same process, a redis-server started for the run (reached through its Unix socket); one Envoy with one worker; each callout answered 1 ms (virtual) after it left; the example policy (`examples/policy.json`: per client `gcra` 10/s burst 30, and a shadow `sliding_window` 300/min). The baseline replays the same trace through the no-op filter: the host, the trace and the replay loop alone, without a callout. Wall time of the replay loop (the trace is read and the module compiled before it). Each trace is replayed {REPLAY_RUNS} times through sluice, each time against a fresh Redis: this machine's speed changes from minute to minute, so the table gives the median run and the range.\n"
    )?;
    writeln!(
        out,
        "| trace | requests | callouts | denied | replay s (median of {REPLAY_RUNS}) | requests/s (median) | slowest .. fastest run | no-op filter requests/s | ratio |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|")?;
    let mut workloads = Vec::new();
    match replay::zanbil() {
        Ok(w) => workloads.push(w),
        Err(why) => writeln!(out, "| zanbil: skipped, {why} | | | | | | | | |")?,
    }
    workloads.push(replay::synthetic(
        Kind::Steady,
        20.0,
        240,
        1_000_000,
        "200 clients at 4 to 44 requests/s; the deny cache answers many",
    ));
    workloads.push(replay::synthetic(
        Kind::Steady,
        8.0,
        600,
        500_000,
        "200 clients at 2 to 18 requests/s; nearly every request a callout",
    ));
    let mut wasm_rates = Vec::new();
    for workload in &workloads {
        eprintln!("bench: replaying {} ...", workload.name);
        let r = replay::rate(modules, workload, REPLAY_RUNS)?;
        wasm_rates.push(r.rate());
        let (slowest, fastest) = r.rate_range();
        writeln!(
            out,
            "| {} | {} | {} | {} | {:.1} | {:.0} | {:.0} .. {:.0} | {:.0} | {:.2} |",
            r.name,
            r.requests,
            r.callouts,
            r.denied,
            r.median_wall().as_secs_f64(),
            r.rate(),
            slowest,
            fastest,
            r.noop_rate(),
            r.rate() / r.noop_rate().max(1e-9)
        )?;
    }
    writeln!(out, "\n{REPLAY_TIME_GOES}")?;
    native_replay_table(&workloads, &wasm_rates, &mut out)?;
    Ok(out)
}

/// Issue 58's bar for a replay through the native filter's model.
const NATIVE_REPLAY_BAR: f64 = 20_000.0;

/// The same traces through the model of Envoy's native rate limit filter.
fn native_replay_table(
    workloads: &[replay::Workload],
    wasm_rates: &[f64],
    out: &mut String,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "\n### Through Envoy's native rate limit filter\n\n`sluice-sim replay --envoy-config envoy/envoy-ratelimit.yaml --rls-config envoy/ratelimit` in virtual time: the model of `envoy.filters.http.ratelimit` makes each request's descriptors, and one `ShouldRateLimit` call a request goes to the server in the same process (gRPC framing and protobuf, no socket), a fresh Redis each run. The baseline is the .wasm's median rate on the same trace, from the table above. The bar: at least {NATIVE_REPLAY_BAR:.0} requests a second; met only if the slowest of {REPLAY_RUNS} runs meets it.\n"
    )?;
    writeln!(
        out,
        "| trace | requests | calls | denied | requests/s (median) | slowest .. fastest run | ÷ .wasm replay | at least {NATIVE_REPLAY_BAR:.0}/s |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|")?;
    for (workload, wasm_rate) in workloads.iter().zip(wasm_rates) {
        eprintln!(
            "bench: replaying {} through the native filter ...",
            workload.name
        );
        let r = replay::native_rate(workload, REPLAY_RUNS)?;
        let (slowest, fastest) = (r.rates[0], r.rates[r.rates.len() - 1]);
        let verdict = if slowest >= NATIVE_REPLAY_BAR {
            "met"
        } else if fastest < NATIVE_REPLAY_BAR {
            "not met"
        } else {
            "runs straddle it"
        };
        writeln!(
            out,
            "| {} | {} | {} | {} | {:.0} | {slowest:.0} .. {fastest:.0} | {:.2} | {verdict} |",
            workload.name,
            workload.trace.records.len(),
            r.calls,
            r.denied,
            r.median(),
            r.median() / wasm_rate.max(1e-9),
        )?;
    }
    writeln!(
        out,
        "\n### Through Envoy's quota filter\n\n`sluice-sim replay --envoy-config envoy/envoy-rlqs.yaml --rlqs-config envoy/rlqs`, one Envoy, in virtual time: each request decided in the modelled Envoy by its bucket's assignment, the Envoy's reports (every 5 s and at each new bucket) and the quota service's steps (every second) exchanged with the service in the same process. The baseline is the .wasm's median rate on the same trace.\n"
    )?;
    writeln!(
        out,
        "| trace | requests | denied | requests/s (median) | slowest .. fastest run | ÷ .wasm replay |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|")?;
    for (workload, wasm_rate) in workloads.iter().zip(wasm_rates) {
        eprintln!(
            "bench: replaying {} through the quota filter ...",
            workload.name
        );
        let (rates, denied) = replay::quota_rate(workload, REPLAY_RUNS)?;
        let median = rates[rates.len() / 2];
        writeln!(
            out,
            "| {} | {} | {denied} | {median:.0} | {:.0} .. {:.0} | {:.2} |",
            workload.name,
            workload.trace.records.len(),
            rates[0],
            rates[rates.len() - 1],
            median / wasm_rate.max(1e-9),
        )?;
    }
    Ok(())
}
