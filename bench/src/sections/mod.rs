//! Each section of BENCHMARKS.md: measured by its module, written here with what it means.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::chart_dir::ChartDir;
use crate::filter::{self, Modules};
use crate::{envoy, grpc, lease, replay, server};

mod replay_rate;

use replay_rate::REPLAY_RUNS;
pub use replay_rate::replay_section;

/// The real-Envoy section.
pub fn envoy_section(options: &envoy::Options, charts: ChartDir) -> anyhow::Result<String> {
    let modules = Modules::built();
    let results = envoy::run(&modules, options)?;
    envoy::section(&results, &modules.sluice, &envoy_version()?, charts)
}

/// `envoy --version`'s version number.
pub fn envoy_version() -> anyhow::Result<String> {
    let output = std::process::Command::new(sluice_harness::envoy_binary()?)
        .arg("--version")
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    // "<path>  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL"
    let after = text
        .split_once("version: ")
        .map_or(text.as_ref(), |(_, v)| v);
    Ok(after
        .split('/')
        .nth(1)
        .map_or_else(|| text.trim().to_owned(), str::to_owned))
}

/// Requests in flight for the gRPC comparison.
const GRPC_IN_FLIGHT: usize = 16;

pub fn grpc_section(seconds: u64) -> anyhow::Result<String> {
    let rounds = grpc::run(GRPC_IN_FLIGHT, Duration::from_secs(seconds), SERVER_RUNS)?;
    let mut out = String::new();
    writeln!(
        out,
        "The release `sluice-server` (`--threads 1 --busy-poll-us {}`, as in the server section) answering Envoy's `ShouldRateLimit` (tonic clients) and `POST /v1/decide` (the lean HTTP/1.1 client above), {GRPC_IN_FLIGHT} requests in flight, one API after the other, {SERVER_RUNS} rounds of {seconds} s: the same `gcra` decision for keys spread over 10,000 clients. gRPC is asked twice: over {GRPC_IN_FLIGHT} HTTP/2 connections with one request in flight on each, like for like with `/v1/decide` over {GRPC_IN_FLIGHT} keep-alive connections; and over one connection carrying all {GRPC_IN_FLIGHT}, as one Envoy worker's native rate limit filter multiplexes its requests. CPU a decision as in the server section (user and system time from `/proc` and Redis' `INFO`, over each run's warm-up and measured span, divided by the decisions Redis made). The rows are the round of median ratio (gRPC over `/v1/decide`, like for like), with the range.\n",
        server::BUSY_POLL_US,
    )?;
    writeln!(
        out,
        "| API | connections x in flight on each | decisions/s | p50 ms | p99 ms | client µs a decision | sluice-server µs | Redis µs | cores busy |\n|---|---|---|---|---|---|---|---|---|"
    )?;
    let median = &rounds[rounds.len() / 2];
    for (api, layout, side) in [
        ("gRPC `ShouldRateLimit`", (GRPC_IN_FLIGHT, 1), &median.grpc),
        (
            "gRPC `ShouldRateLimit`",
            (1, GRPC_IN_FLIGHT),
            &median.grpc_multiplexed,
        ),
        ("`/v1/decide`", (GRPC_IN_FLIGHT, 1), &median.decide),
    ] {
        let m = &side.measured;
        let cpu = side.cpu.per_decision_us();
        writeln!(
            out,
            "| {api} | {} x {} | {:.0} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {:.2} |",
            layout.0,
            layout.1,
            m.rate(),
            m.quantile_ms(0.5),
            m.quantile_ms(0.99),
            cpu[0],
            cpu[1],
            cpu[2],
            m.rate() * cpu.iter().sum::<f64>() / 1e6,
        )?;
    }
    let range = |ratio: fn(&grpc::Round) -> f64| {
        rounds
            .iter()
            .map(ratio)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
                (lo.min(x), hi.max(x))
            })
    };
    let (low, high) = range(grpc::Round::ratio);
    let (m_low, m_high) = range(grpc::Round::multiplexed_ratio);
    writeln!(
        out,
        "\ngRPC over `/v1/decide`, like for like: {:.2} (median round; {low:.2} .. {high:.2}). Over one multiplexed connection: {:.2} in the same round ({m_low:.2} .. {m_high:.2} over the rounds).\n",
        median.ratio(),
        median.multiplexed_ratio(),
    )?;
    let server_us = |side: &grpc::Side| side.cpu.per_decision_us()[1];
    writeln!(
        out,
        "*Cores busy*: the three processes' CPU a second, out of the machine's 2. One request in flight a connection, gRPC is CPU-bound: the server spent {:.1} µs a decision on it against {:.1} on `/v1/decide` (HTTP/2's frames and header compression, gRPC's trailers and protobuf, a request at a time; a plain call is read and answered before the router and tonic, which took 74,700 instructions a call here, 63,300 since: callgrind, 16 x 1). One connection carrying every request in flight costs the server less a decision ({:.1} µs: a batch of requests shares each read and write) but, in a closed loop, moves in lockstep: the server reads the whole batch at once, Redis answers it in one reply, the server writes every answer at once and every caller asks again at once, so mostly one process works at a time and the rate is set by the batch's trip around all three, not by anyone's CPU. An Envoy worker's connection lies between the two: its requests come when its own clients send them, out of step, and share reads and writes when they coincide.",
        server_us(&median.grpc),
        server_us(&median.decide),
        server_us(&median.grpc_multiplexed),
    )?;
    Ok(out)
}

/// How many times each server configuration is measured.
const SERVER_RUNS: usize = 3;

/// The server section's chart.
const SERVER_CHART: &str = "server-cpu.svg";

pub fn server_section(
    seconds: u64,
    load: &[(usize, usize)],
    standins_at: &[(usize, usize)],
    standin_seconds: u64,
    charts: ChartDir,
) -> anyhow::Result<String> {
    let rows = server::run(
        load,
        Duration::from_secs(seconds),
        SERVER_RUNS,
        standins_at,
        Duration::from_secs(standin_seconds),
    )?;
    let mut out = String::new();
    writeln!(
        out,
        "The release `sluice-server` binary in its own process with one thread (`--threads 1`, as Redis and redis-benchmark have one), polling its sockets for up to {} µs after each Redis call rather than sleeping (`--busy-poll-us {}`; it sleeps by default, measured below), deciding `gcra` for keys spread over 10,000 clients, under a closed-loop load of keep-alive HTTP/1.1 connections from a lean client (requests built before the run, byte for byte as the filter writes them; answers read with `httparse`); beside it, `redis-benchmark` with as many connections running the same script with the arguments the server passes, on the same Redis: by `EVALSHA` (the baseline the ratio is taken against), and by `FCALL` of its function in sluice's library, as the server calls it. Ratio: sluice's decisions per second over redis-benchmark's `EVALSHA` calls per second, which is measured right before sluice's side and right after it in each round, for about as long, and taken as the mean of the two, so that a drift of this machine's speed over the round favours neither side; redis-benchmark warms Redis up first, as the load generator's first second does for sluice, and `FCALL` runs last. Load generator, server and Redis share the machine's two cores. Each configuration is measured {SERVER_RUNS} times for {seconds} s ({standin_seconds} s at {}, where the bar is set and the stand-ins below are measured), the first after a round that is not counted, while the machine settles from the build before it: the row is the run of median ratio, with the range.\n",
        server::BUSY_POLL_US,
        server::BUSY_POLL_US,
        standins_at
            .iter()
            .map(|(c, _)| format!("{c} connections"))
            .collect::<Vec<_>>()
            .join(", "),
    )?;
    writeln!(
        out,
        "| connections | checks/request | requests/s | decisions/s | p50 ms | p99 ms | redis-benchmark EVALSHA/s | its p99 ms | ratio to EVALSHA (median) | lowest .. highest | redis-benchmark FCALL/s | ratio to FCALL |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|")?;
    for row in &rows {
        let r = row.median();
        let (lowest, highest) = row.ratio_range();
        writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {:.3} | {:.3} | {:.0} | {:.3} | {:.2} | {lowest:.2} .. {highest:.2} | {:.0} | {:.2} |",
            row.concurrency,
            row.checks,
            r.sluice.rate(),
            r.decisions_per_second(),
            r.sluice.quantile_ms(0.5),
            r.sluice.quantile_ms(0.99),
            r.baseline_rate(),
            r.baseline_p99_ms(),
            r.ratio(),
            r.fcall.rate,
            r.fcall_ratio(),
        )?;
    }
    writeln!(
        out,
        "\nCPU a decision, in the same runs (user and system time from `/proc` and Redis' `INFO`, over each run's warm-up and measured span, divided by the decisions Redis made in it): on sluice's side the load generator, the server and Redis; on the baseline's, redis-benchmark and Redis. The two cores give 2,000,000 µs a second, so a side's rate is at most that over its total, and less by whatever time the cores sit idle while the processes wait on one another.\n"
    )?;
    writeln!(
        out,
        "| connections | checks/request | load generator µs | sluice-server µs | Redis µs | sluice total µs | redis-benchmark µs | Redis µs (EVALSHA) | EVALSHA total µs | Redis µs (FCALL) |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|")?;
    for row in &rows {
        let r = row.median();
        let [client, server, redis] = r.sluice_cpu_us();
        let [benchmark, redis_evalsha] = r.baseline_cpu_us();
        writeln!(
            out,
            "| {} | {} | {client:.1} | {server:.1} | {redis:.1} | {:.1} | {benchmark:.1} | {redis_evalsha:.1} | {:.1} | {:.1} |",
            row.concurrency,
            row.checks,
            client + server + redis,
            benchmark + redis_evalsha,
            r.fcall.redis.cpu_us_per_decision(),
        )?;
    }
    let chart = charts.write(SERVER_CHART, server::cpu_chart(&rows))?;
    writeln!(out, "\n![CPU a decision]({chart})")?;
    standin_table(&mut out, &rows)?;
    writeln!(out, "\n{SERVER_TIME_GOES}")?;
    Ok(out)
}

pub fn filter_section(rounds: usize, profiles: Option<&Path>) -> anyhow::Result<String> {
    let bench = std::env::current_exe()?;
    let f = filter::run(&Modules::built(), rounds, &bench, profiles)?;
    let mut out = String::new();
    writeln!(
        out,
        "Both filters in the simulator's wasmtime host (wasmtime 48, Cranelift), one worker, the same {} requests (50 clients, 10 API keys; API calls, searches, pages). sluice's filter runs a policy of three rules (per client address `gcra`, per API key `sliding_window` on `/api/`, `token_bucket` on `GET /api/search`), so a request matches one to three of them; its callouts were answered by the real server and Redis in a first pass and the answers are replayed, so that only the host and the filter are measured: the request-headers callback to the callout, and the answer's delivery to the response, through `on_log` and `on_done`. The no-op filter (`bench/noop`, the same SDK and build profile) lets every request through. Time: the median of {rounds} passes; instructions: `valgrind --tool=callgrind` over {} requests, counting only the measured section.\n",
        filter::REQUESTS,
        filter::CALLGRIND_REQUESTS,
    )?;
    writeln!(
        out,
        "sluice's filter in these passes: {} callouts, {} allowed, {} denied (of which the deny cache answered {}).\n",
        f.counts.callouts,
        f.counts.allowed,
        f.counts.denied,
        (f.counts.allowed + f.counts.denied).saturating_sub(f.counts.callouts),
    )?;
    let modules = Modules::built();
    let size = |path: &Path| {
        std::fs::metadata(path).map_or("-".to_owned(), |m| {
            format!("{:.0} KiB", m.len() as f64 / 1024.0)
        })
    };
    writeln!(
        out,
        "| filter | µs per request | instructions per request | .wasm size |"
    )?;
    writeln!(out, "|---|---|---|---|")?;
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (si, ni) = f
        .instructions
        .map_or(("-".to_owned(), "-".to_owned()), |(s, n)| {
            (format!("{s:.0}"), format!("{n:.0}"))
        });
    writeln!(
        out,
        "| no-op proxy-wasm filter (baseline) | {:.2} | {ni} | {} |",
        us(f.noop),
        size(&modules.noop)
    )?;
    writeln!(
        out,
        "| sluice, 3 rules | {:.2} | {si} | {} |",
        us(f.sluice),
        size(&modules.sluice)
    )?;
    let ratio_i = f
        .instructions
        .map_or("-".to_owned(), |(s, n)| format!("{:.2}", s / n.max(1.0)));
    writeln!(
        out,
        "| ratio sluice / no-op | {:.1} | {ratio_i} | |\n",
        us(f.sluice) / us(f.noop).max(1e-9)
    )?;
    if let Some(note) = f.instructions_note {
        writeln!(out, "Instructions not counted: {note}\n")?;
    }
    writeln!(out, "{FILTER_TIME_GOES}")?;
    Ok(out)
}

/// Where each section's time goes: measured by hand (profiles, system call counts), so written
/// once in `bench/notes/`, with the history in `docs/performance-log.md`.
const SERVER_TIME_GOES: &str = include_str!("../../notes/server.md");
const FILTER_TIME_GOES: &str = include_str!("../../notes/filter.md");

pub fn deny_cache_section(modules: &Modules) -> anyhow::Result<String> {
    let workload = replay::attack_trace();
    eprintln!("bench: the deny cache on {} ...", workload.name);
    let rows = replay::deny_cache(modules, &workload)?;
    let mut out = String::new();
    writeln!(
        out,
        "{}: 200 clients at about one request a second and one (`203.0.113.66`) at a hundred, for 10 minutes; one rule, per client address, `gcra` 1/s burst 10. Replayed as above, against a redis-server whose `INFO commandstats` counts what it ran.\n",
        workload.name
    )?;
    writeln!(
        out,
        "| deny cache | requests | callouts | Redis script calls | Redis commands | admitted | abuser admitted / offered | replay s |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|")?;
    for r in &rows {
        writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} / {} | {:.1} |",
            if r.deny_cache { "on" } else { "off" },
            r.requests,
            r.callouts,
            r.script_calls,
            r.redis_commands,
            r.admitted,
            r.attacker_admitted,
            r.attacker_offered,
            r.wall.as_secs_f64()
        )?;
    }
    if let [on, off] = rows.as_slice() {
        writeln!(
            out,
            "\nWith the cache: {:.0}% fewer callouts, {:.0}% fewer Redis commands; admitted {} against {} without it ({}).\n",
            100.0 * (1.0 - on.callouts as f64 / off.callouts.max(1) as f64),
            100.0 * (1.0 - on.redis_commands as f64 / off.redis_commands.max(1) as f64),
            on.admitted,
            off.admitted,
            if on.admitted <= off.admitted {
                "the cache admits no more"
            } else {
                "THE CACHE ADMITTED MORE: a bug"
            }
        )?;
    }
    Ok(out)
}

/// The lease section's chart.
const LEASE_CHART: &str = "lease-hot-key.svg";

pub fn lease_section(modules: &Modules, charts: ChartDir) -> anyhow::Result<String> {
    let workload = lease::workload();
    let rows = lease::run(modules, &workload, REPLAY_RUNS)?;
    let chart = charts.write(LEASE_CHART, lease::chart(&rows))?;
    let mut out = String::new();
    writeln!(
        out,
        "{}: one rule, per tenant (`x-api-key`), `gcra` 1,000/s burst 1,000, so two tenants are over their limit (2.4x and 1.2x). `sluice-sim replay` in virtual time through 4 Envoys of 2 workers each, one server and one Redis, each callout answered 1 ms (virtual) after it left. The same trace, policy and topology in both rows; the lease row's rule adds `\"lease\": {}` (one Envoy may hold 100 units of a key, all Envoys 500). Each mode replayed {REPLAY_RUNS} times: the rate is the median run and the range; the other figures are the same in every run (virtual time).\n",
        workload.name,
        lease::LEASE
    )?;
    writeln!(
        out,
        "| decisions | callouts | per 1,000 requests | of them lease calls | decided in Envoy | requests/s (median) | slowest .. fastest | admitted | over the bound (bound) | denied though an exact limiter admits | admitted over the exact limit |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|")?;
    for r in &rows {
        let a = &r.accuracy;
        let (rate, slow, fast) = r.rates();
        writeln!(
            out,
            "| {} | {} | {:.1} | {} | {} | {:.0} | {:.0} .. {:.0} | {} | {} ({}) | {} ({:.2}% of admitted) | {} |",
            r.mode,
            r.callouts,
            r.per_thousand(),
            r.lease_calls,
            r.local,
            rate,
            slow,
            fast,
            a.admitted,
            a.over_bound,
            a.bound,
            a.denied_under_exact,
            100.0 * a.denied_under_exact as f64 / a.admitted.max(1) as f64,
            a.over_exact,
        )?;
    }
    writeln!(
        out,
        "\n- *The bound* is the algorithm's own for one second (burst + rate x 1 s = 2,000), plus, with leases, the 500 units all Envoys may hold of one key (`docs/algorithms.md`). *Over the bound* counts admitted requests that took their key over it in the second ending with them.\n- *Denied though an exact limiter admits*: denied requests that an exact limit of 1,000 in any second, given what the key had admitted in the second before them, would have admitted (filling each free slot once). *Admitted over the exact limit*: the mirror image; `gcra`'s burst of 1,000 on top of its rate puts both modes over it at the start.\n- Decided request by request, which of a key's requests get in when it is 2.4 times over its limit is a coin toss that no two limiters toss alike: against the rule's own algorithm deciding every request in order, the per-request row differs on {} denials and the lease row on {} (of {} it admits), though both admit the limit, second by second ([chart]({chart})).\n",
        rows.first()
            .map_or(0, |r| r.accuracy.own_algorithm.denied_but_exact_admits),
        rows.last()
            .map_or(0, |r| r.accuracy.own_algorithm.denied_but_exact_admits),
        rows.last().map_or(0, |r| r.accuracy.own_algorithm.admitted),
    )?;
    writeln!(
        out,
        "![the hottest tenant's admissions in the trailing second, per request and with leases]({chart})\n"
    )?;
    Ok(out)
}

/// sluice-server beside its stand-ins, where they were measured.
pub fn standin_table(out: &mut String, rows: &[server::Row]) -> anyhow::Result<()> {
    let measured: Vec<_> = rows
        .iter()
        .filter(|row| {
            server::Standin::ALL
                .iter()
                .any(|&s| row.standin(s).is_some())
        })
        .collect();
    if measured.is_empty() {
        return Ok(());
    }
    let poll = server::BUSY_POLL_US;
    writeln!(
        out,
        "\nIn sluice-server's place, under the same load, in the same rounds (each server in turn goes first, second and third: whichever goes later in a round tends to run faster), each ratio taken to the same round's `EVALSHA`:\n\n- *sleeping*: sluice-server as it runs by default, without `--busy-poll-us`, going to sleep whenever it waits. What is between this and the row above is what polling buys, and the CPU it costs.\n- *the floor* (`bench/examples/floor.rs`): the least a server on the same stack can do, tokio and the Redis client on one thread, its Redis connection set up as sluice-server's (Nagle off), polling as sluice-server does, with no policy, body, clock or metrics. It reads each request with `httparse`, makes the very `FCALL` sluice-server makes for the check, and writes a canned answer. What is between it and sluice-server is what sluice's own code costs; what is between it and 1 is the stack's and the machine's.\n"
    )?;
    writeln!(
        out,
        "| connections | checks/request | server | decisions/s | p99 ms | ratio (median) | lowest .. highest | server µs a decision |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|")?;
    for row in measured {
        let r = row.median();
        let (lowest, highest) = row.ratio_range();
        writeln!(
            out,
            "| {} | {} | sluice-server, `--busy-poll-us {poll}` | {:.0} | {:.3} | {:.2} | {lowest:.2} .. {highest:.2} | {:.1} |",
            row.concurrency,
            row.checks,
            r.decisions_per_second(),
            r.sluice.quantile_ms(0.99),
            r.ratio(),
            r.sluice_cpu_us()[1],
        )?;
        for standin in server::Standin::ALL {
            let Some(s) = row.standin(standin) else {
                continue;
            };
            let name = match standin {
                server::Standin::Sleeping => "sluice-server, sleeping (its default)".to_owned(),
                server::Standin::Floor => format!("the floor, `--busy-poll-us {poll}`"),
            };
            writeln!(
                out,
                "| {} | {} | {name} | {:.0} | {:.3} | {:.2} | {:.2} .. {:.2} | {:.1} |",
                row.concurrency,
                row.checks,
                s.median.measured.rate() * row.checks as f64,
                s.median.measured.quantile_ms(0.99),
                s.median.ratio,
                s.lowest,
                s.highest,
                s.median.cpu.per_decision_us()[1],
            )?;
        }
    }
    Ok(())
}
