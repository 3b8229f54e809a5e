//! `sluice-bench`: what `make bench` runs. Each figure is measured beside its baseline in the
//! same run, because these machines are noisy; `all` writes them to BENCHMARKS.md.

mod cpu;
mod filter;
mod grpc;
mod lease;
mod load;
mod memory;
mod replay;
mod server;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use sluice_sim::trace::synthetic::Kind;

use crate::filter::{Modules, Which};

// The allocator `sluice-sim` runs with, so that replay rates here are the ones users see.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "sluice-bench",
    about = "Measures sluice against its baselines."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// sluice-server beside redis-benchmark running the same script.
    Server {
        /// Seconds per measurement.
        #[arg(long, default_value_t = 3)]
        seconds: u64,
        /// Configurations as connections:checks, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "16:1,32:1,64:1,32:3")]
        load: Vec<String>,
        /// Also measure the floor (bench/examples/floor.rs) in every one-check configuration.
        #[arg(long)]
        floor: bool,
    },
    /// Envoy's gRPC rate limit API beside /v1/decide, on one server.
    Grpc {
        /// Seconds per measurement.
        #[arg(long, default_value_t = 3)]
        seconds: u64,
    },
    /// Redis memory per key and commands per decision, for each algorithm.
    Memory,
    /// The filter's cost per request in wasmtime, beside a no-op filter.
    Filter {
        /// Timed passes of each filter.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Keep callgrind's profiles here (`callgrind_annotate DIR/sluice.out`).
        #[arg(long)]
        profiles: Option<PathBuf>,
    },
    /// One pass of a filter with recorded callout answers (what callgrind runs).
    FilterPass {
        /// Which filter.
        #[arg(long, value_enum)]
        filter: Which,
        /// Requests.
        #[arg(long)]
        requests: usize,
        /// The recorded answers (JSON).
        #[arg(long)]
        answers: PathBuf,
    },
    /// The simulator's replay rate, and the deny cache on an attack trace.
    Replay,
    /// Lease mode beside per-request decisions on a hot-key trace.
    Lease,
    /// Everything, written to a Markdown file.
    All {
        /// Where to write the results.
        #[arg(long, default_value = "BENCHMARKS.md")]
        out: PathBuf,
        /// Seconds per server measurement.
        #[arg(long, default_value_t = 3)]
        seconds: u64,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Requests in flight for the gRPC comparison.
const GRPC_IN_FLIGHT: usize = 16;

fn grpc_section(seconds: u64) -> anyhow::Result<String> {
    let rounds = grpc::run(GRPC_IN_FLIGHT, Duration::from_secs(seconds), SERVER_RUNS)?;
    let mut out = String::new();
    writeln!(
        out,
        "The release `sluice-server` (`--threads 1`) answering Envoy's `ShouldRateLimit` (tonic clients) and `POST /v1/decide` (the lean HTTP/1.1 client above), {GRPC_IN_FLIGHT} requests in flight, one API after the other, {SERVER_RUNS} rounds of {seconds} s: the same `gcra` decision for keys spread over 10,000 clients. gRPC is asked twice: over {GRPC_IN_FLIGHT} HTTP/2 connections with one request in flight on each, like for like with `/v1/decide` over {GRPC_IN_FLIGHT} keep-alive connections; and over one connection carrying all {GRPC_IN_FLIGHT}, as one Envoy worker's native rate limit filter multiplexes its requests. CPU a decision as in the server section (user and system time from `/proc` and Redis' `INFO`, over each run's warm-up and measured span, divided by the decisions Redis made). The rows are the round of median ratio (gRPC over `/v1/decide`, like for like), with the range.\n"
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
        "*Cores busy*: the three processes' CPU a second, out of the machine's 2. One request in flight a connection, gRPC is CPU-bound: the server spent {:.1} µs a decision on it against {:.1} on `/v1/decide` (HTTP/2's frames and header compression, protobuf and tonic's layers, a request at a time). One connection carrying every request in flight costs the server less a decision ({:.1} µs: a batch of requests shares each read and write) but, in a closed loop, moves in lockstep: the server reads the whole batch at once, Redis answers it in one reply, the server writes every answer at once and every caller asks again at once, so mostly one process works at a time and the rate is set by the batch's trip around all three, not by anyone's CPU. An Envoy worker's connection lies between the two: its requests come when its own clients send them, out of step, and share reads and writes when they coincide.",
        server_us(&median.grpc),
        server_us(&median.decide),
        server_us(&median.grpc_multiplexed),
    )?;
    Ok(out)
}

/// How many times each server configuration is measured.
const SERVER_RUNS: usize = 3;

/// Where the server section's chart goes, beside BENCHMARKS.md.
const SERVER_CHART: &str = "bench/server-cpu.svg";

/// Where `make bench` measures the floor too: the configuration issue 15's bar is set at.
const FLOOR_LOAD: [(usize, usize); 1] = [(16, 1)];

fn server_section(
    seconds: u64,
    load: &[(usize, usize)],
    floor_at: &[(usize, usize)],
) -> anyhow::Result<String> {
    let rows = server::run(load, Duration::from_secs(seconds), SERVER_RUNS, floor_at)?;
    let mut out = String::new();
    writeln!(
        out,
        "The release `sluice-server` binary in its own process with one thread (`--threads 1`, as Redis and redis-benchmark have one), deciding `gcra` for keys spread over 10,000 clients, under a closed-loop load of keep-alive HTTP/1.1 connections from a lean client (requests built before the run, byte for byte as the filter writes them; answers read with `httparse`); beside it, `redis-benchmark` with as many connections running the same script with the arguments the server passes, on the same Redis: by `EVALSHA` (the baseline the ratio is taken against), and by `FCALL` of its function in sluice's library, as the server calls it. Ratio: sluice's decisions per second over redis-benchmark's calls per second, each measured right after sluice. Load generator, server and Redis share the machine's two cores. Each configuration is measured {SERVER_RUNS} times for {seconds} s: the row is the run of median ratio, with the range.\n"
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
            r.baseline.0,
            r.baseline.2,
            r.ratio(),
            r.fcall.0,
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
            r.fcall_redis.cpu_us_per_decision(),
        )?;
    }
    std::fs::write(SERVER_CHART, server::cpu_chart(&rows))?;
    writeln!(out, "\n![CPU a decision]({SERVER_CHART})")?;
    floor_table(&mut out, &rows)?;
    writeln!(
        out,
        "\nWhere the time goes (the table above measures the split in every run): half of the server's CPU is the kernel's (perf, 2026-11-23), most of it the answer's `writev`: on loopback the sender runs the receiver's TCP path and wakes it, so sluice-server pays for the client's receive and the client for the server's, as redis-benchmark and Redis pay for each other's. Its system calls a decision at 16 connections (perf's tracepoints over 3 s, 108.8k decisions, 2026-11-24): 1.03 `recvfrom`, 1.11 `writev` (an answer each, and a write to Redis for about nine commands), 0.08 `write` and 0.29 `epoll_wait` (about 3.5 decisions a wake-up), 2.5 in all: one read and one write a request, the fewest that keep-alive HTTP/1.1 with one request in flight on a connection allows. The other half, counted by callgrind over one keep-alive connection (3,000 decisions), was 56.4k instructions a decision before commit 11edc40 and 42.1k since 60982ba: `/v1/decide` bodies are read and answered by hand-written code beside the filter's own (serde's general path took 5.8k to read a body and 3.9k to write the answer; a property test holds both to serde's bytes and values), decisions reach their handler before axum's router (which cost 4.7k a request), and a check's script arguments go into `FCALL` without a string each (45 allocations and 7 reallocations a decision before, 28 after); over 4 alternating rounds at 16 connections the server's CPU a decision went from 19.1 .. 22.5 µs to 15.0 .. 19.0. Counted at 16 connections, under the bench's own load (2026-11-24), it was 36.5k at commit d4ad950 and is 30.1k since e24191b: the scripts answer with one string of integers, which the Redis client reads as a single value where an array of six integers cost its RESP parser (`combine`) about 5.5k (b1ed29b; Redis spends about 0.08 µs more a call on `string.format`, and so does the baseline, which runs the same script); a Redis call arms one timer instead of two (the client's own response timeout repeated the server's), so tokio writes to its own eventfd 0.6 times a decision instead of 1.5 (`strace -c`); and a decision's body is taken as hyper hands it over instead of through axum's `to_bytes`. Over 4 alternating rounds at 16 connections the server's CPU a decision went from 15.1 .. 16.2 µs (median 15.65) to 14.0 .. 14.9 (median 14.5). What is left, by crate: hyper and http 7.3k (reading the request 3.1k of it), tokio 4.8k, sluice's server 3.8k and core 2.1k, the Redis client 3.4k and 0.6k of number formatting (a command's arguments are written once into the command and again as RESP), the allocator 2.8k, copies 2.1k. Redis itself is not the gap: it spends less CPU on a decision of sluice's than on one of redis-benchmark's, since the server's commands reach it many to a read on one connection. The gap is the server's own CPU: when both sides leave the cores equally idle, the ratio is the baseline's total over sluice's, and sluice's total is the baseline's plus the server's less what Redis saves, so 0.8 needs sluice's total within 1.25 times the baseline's. At 16 connections it stood at 1.40 and 1.47 times in the two `make bench` runs of 2026-11-23, before the changes above (ratios 0.67 and 0.65); at 32 and 64 connections, where more requests share each of the server's wake-ups, at 1.09 to 1.20 (ratios 0.80 to 0.87). Since commit 287c174 the server calls its scripts as Redis Functions, so a script's definitions (the prelude, the schedule, the algorithms) no longer run on every call: on one binary, 3 alternating runs at 16 connections, Redis spent 15.1 to 20.6 µs (median 15.5) a decision by `FCALL` against 18.0 to 21.7 (median 20.0) with `--redis-scripts eval`, and the ratio went from 0.59 .. 0.66 to 0.66 .. 0.72. Inside one gcra call (`INFO commandstats`, one client, this machine): an `FCALL` that does nothing costs 6 to 8 µs, reading the arguments and the time 5 to 8 more, the arithmetic 3 to 4, the `GET` and the `SET … PX` 7 to 8 together. Deciding several waiting requests in one script call (tried: up to 18 a call at 64 connections) cut Redis' time a decision by about a tenth but not the server's, and did not raise the rate, so the server makes one call a request. Tried on 2026-11-23 and not kept: the server polling its sockets (yielding the CPU each round) for up to 50 or 200 µs before it sleeps, as the simulator does, raised the 16-connection ratio from a median of 0.66 to 0.70 .. 0.73 over 3 alternating rounds, short of 0.8, at the price of a core spinning whenever the server is busy, taken from Redis on a small machine. Also tried and not kept, when each request still armed two timers, each due before the event loop's next wake-up so that tokio wrote to its eventfd to wake itself: a standing timer that keeps the next wake-up ahead of them took those writes from 1.4 to 0.07 a request (`strace -c`) but not the server's CPU: over 4 alternating runs, 22.0 to 25.4 µs a decision without it and 22.3 to 25.6 with it, or 1.35 and 1.37 times Redis' time in the same runs. Tried on 2026-11-24 and not kept: spreading the server's calls over 2 or 4 Redis connections instead of one, so that Redis could start on some while the server still reads others (ratios 0.57 to 0.66 against 0.74 and 0.78 on one connection, 2 alternating rounds: Redis and the server both spent more a decision, each connection's calls arriving fewer to a read); and building the server with fat LTO and one codegen unit, which cut its user-space instructions a decision by 5 % (callgrind: 41.9k to 39.7k) but not its measured CPU (19.6 to 21.4 µs against 18.5 to 20.4, 3 alternating rounds), at the price of slower release builds. The floor under it (2026-11-24, late; `bench/examples/floor.rs`, described with its table above): run as a separate bench alternating with sluice-server (10 rounds each), it spent 10.8 to 14.9 µs of CPU a decision against sluice-server's 15.0 to 20.8, and its median ratio was 0.78 (0.67 .. 0.85) against 0.77 (0.66 .. 0.83): between invocations minutes apart, this machine's swings hide the difference. Measured in the same rounds as sluice-server (the floor's table above), 8 runs of `sluice-bench server --load 16:1 --floor`, 5 with the floor after sluice-server and 3 with it before: the floor's median ratio was 0.77 to 0.93 against sluice-server's 0.69 to 0.88, higher in 7 of the 8 (by 0.06 in the middle one), its range clear of 0.8 in 2 of them. Part of that lead is the order: with the floor in both places (4 runs, 2026-11-25), the one measured second ran more decisions a second in all 4 and had the higher median ratio in 2 (0.80 against 0.74, 0.77 against 0.65; the other two within 0.01), at the same CPU a decision; with a timeout around each call, first, against the plain floor, second (4 runs), the CPU was the same (11.9 to 14.0 µs against 11.7 to 14.6) and the second led in all 4. So the floor's rounds now take turns going first and second (in the `make bench` run of 074484a the floor always went second). What is firm is the CPU: the floor spends about 3.5 µs less a decision than sluice-server, worth up to about 0.07 of the ratio at 16 connections if the cores stayed as busy (sluice's side spends about 37 µs a decision in all), though too few runs with the order balanced show how much of it reaches the rate; a timer per call costs nothing measurable. Even the floor meets 0.8 with its range clear of it only now and then: most of the distance to 1 is three processes on two cores waking each other over loopback, where the baseline has two. On 2026-11-25: in the `make bench` run of 074484a sluice's side spent 1.15 times the baseline's CPU a decision (37.3 µs against 32.3) and still ran at 0.76 of its rate, its cores busy 1.40 of 2 against the baseline's 1.60, so the waits between three processes cost as much as the CPU does. Tried then and not kept, each over 4 runs with the unchanged binary in the floor's place: a work-stealing runtime with one worker instead of the current-thread one, whose \"run the task just woken next\" rule hands each command to Redis at once (median ratios 0.72 to 0.81 against 0.76 to 0.84; 15.5 to 20.4 µs a decision against 15.1 to 15.4); and yielding once before answering, so that the commands of a wake-up reach Redis before its answers are written (0.66 to 0.75 against 0.67 to 0.83). The same binary in both places, 4 runs, differed by up to 0.08 in median ratio within a run, and its medians ran from 0.67 to 0.94 across runs.\n"
    )?;
    Ok(out)
}

fn filter_section(rounds: usize, profiles: Option<&Path>) -> anyhow::Result<String> {
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
    writeln!(
        out,
        "Where the time goes (a profile of the filter at commit 89ffa12, 52.3k instructions a request against the no-op's 17.6k; since then, checking every verdict against its rule's limit before it is believed (commit 8e9531b) added about 0.2k; `sluice-bench filter --profiles DIR` and `scripts/name-jit.py` make a fresh one): the host's own path for any request, as the no-op pays it, about 17k; the request-headers callback about 20.6k, of which the callout's dispatch 6.8k (the host sets up the call, the SDK encodes its headers), header, clock and deny-cache reads 3.4k, building keys 2.3k, reading `source.address` 2.1k; the answer's callback about 9k, of which deciding, the decision record and the rate-limit headers 3.8k and reading the answer 2.7k; adding the three rate-limit headers to the response 3.5k. From 63.9k a request: counters handed to Envoy on the tick, once a second, instead of by a host call each per request (about 3k); a free list per size class in front of dlmalloc, which cost about 300 instructions an allocation and its free (about 6.5k); number parsing, the JSON escape scan, key escaping and the deny-cache slot keys (about 0.9k); all of that in the filter, which alone would stand at 53.7k (3.04 times the no-op). The last 1.4k is the simulator's host: it now reads a call's arguments in place, as Envoy's host does, instead of copying each into a buffer of its own (the no-op, which makes no such calls, is unchanged). About 15 host calls a request remain, and they are most of what is left. Since commit d4c6a3d the simulator's host copies less on every callback, for both filters: it borrows the module's exports instead of cloning them (a clone took a reference on the export's type in wasmtime's registry, about 500 instructions a callback), copies a header value or a buffer straight from its own maps into the module's memory as Envoy does, and decodes a callout's headers in place. Sluice went from 51.6k instructions a request to 46.2k and the no-op from 17.5k to 15.5k. The no-op's cost is nearly all host, so the ratio rose from 2.95 to 2.98 while both filters got cheaper. Left alone for the same reason: lower-casing header names as the host builds its maps costs about 5k of sluice's instructions a request and 3k of the no-op's. Making it cheaper would speed up every replay a little, and it would raise the ratio. Instruction counts also move with the build's code layout: the bench binary of commit d4ad950 counts 46,234 and 15,529 instructions a request (2.98), and that of commit e24191b, which changes neither filter, nor the simulator's host, nor this pass (only the server and its scripts), 46,170 and 15,300 (3.02, three runs alike): in the no-op's profile `memcpy` takes about 157 instructions a request less and `Envoy::complete` 81 more, the same code laid out differently. Since then (2026-11-24) sluice's own path is 2.4k instructions a request shorter (callgrind over the bench's pass: 46,202 to 43,839), with neither the simulator's host nor the no-op changed: the client address is borrowed from `source.address` when Envoy wrote it in canonical form, instead of parsed and written again (0.3k); `source.address` is read with a constant path by a host call of the filter's own (0.4k); the header names a request is read by are borrowed from the policy, and a key gets room for 32 bytes up front instead of growing part by part (0.8k); a deny-cache lookup hashes and compares the check's identity in place instead of building it (0.4k); the decision record writes a rule's name without scanning it for JSON escapes, which a rule name cannot need (0.3k); and a request's outcomes are decided check by check instead of through four vectors (0.2k). The ratio now stands about 0.14 under 3.0, three times what the layout alone moved it. Tried and not kept: the rate-limit headers' names as static strings instead of allocated ones. The filter ran fewer instructions, but the simulator's host checks each name it is handed as UTF-8, which costs more on a string that is not aligned to 8 bytes, and the count rose by 0.2k a request.\n"
    )?;
    Ok(out)
}

/// Where a replay's time goes, from a profile of the callout-heavy trace.
const REPLAY_TIME_GOES: &str = "Where the time goes (perf on the callout-heavy trace, measured 2026-11-23 before commit c62ed41): a callout's answer is due 1 ms (virtual) after it leaves, and at 0.8 requests a virtual millisecond the next request seldom comes before it, so most callouts are decided one after another, each a round trip through the in-process server to Redis. Redis spent about 29 µs of CPU on each call of the batch script (two checks), most of it the script call itself rather than the arithmetic; the simulator's thread about 40 µs a request: the in-process server (axum, serde, the Redis client), the write to Redis' socket, which wakes Redis, and the filter in wasmtime (about a tenth). The thread then slept in `epoll_wait` while Redis worked and was woken by the answer, two cross-core wake-ups a callout; since commit c62ed41 it polls the socket for up to 500 µs before it sleeps (runs back to back that morning: 15,300 to 19,400 requests a second before, 24,500 to 25,300 after; whole `make bench` runs since have ranged from 17,700 to 23,500 as this machine's speed changed), and each round of polling offers the CPU to Redis in case the two share a core (pinned to one core, the first 100,000 requests went from 9,500 to 15,300 a second). The dense trace's deny cache answers many requests without a callout, hence its higher rate. Measured again at commit 287c174 on the first 100,000 requests, against one Redis, in a slower hour (15,000 requests a second): the simulator's thread spent about 31 µs of CPU a request and waited about 23 µs a callout for Redis, whose batch call (two checks) took 34.6 to 37.6 µs of script time by `EVALSHA` and 31.1 to 33.0 by `FCALL` (`INFO commandstats`). This virtual machine halts an idle vCPU at once (`haltpoll.guest_halt_poll_ns=0` on its kernel's command line), so a callout that wakes Redis likely pays a trip through the hypervisor: one reason this rate swings with the host's load. Measured on 2026-11-23 by sending 19,275 batch calls captured from a replay one after another to a Redis that sleeps between them, as in a replay: an `FCALL` of a function that does nothing, with the same 23 arguments, took 6 to 7 µs (2.3 µs when redis-benchmark keeps Redis busy), reading the arguments 6 more, the two `GET`s and the batch's own logic about 8, the two algorithms with their `SET`s about 15: Redis runs cold after every wait. Binding the standard library to locals instead of looking it up in the globals made no measurable difference; pinning the simulator and its Redis to one core made the replay slower (12,000 to 15,800 requests a second, against 18,400 to 21,400 unpinned, the same minutes). Since commits 11edc40 and 6bef7c5 the in-process server reads and answers `/v1/decide` by hand-written code and takes decisions before axum's router, as the server binary does: the dense trace ran at 42.0k requests a second (39.8k .. 44.5k) in the `make bench` run of 2026-11-24, against 32.0k and 26.5k in the two of 2026-11-23, and the callout-heavy one at 21.0k (18.3k .. 21.7k) against 18.4k and 14.4k (not side by side: this machine's speed swings). Measured on 2026-11-24 (later) on the first 100,000 requests of the callout-heavy trace, against one Redis: Redis was busy about two thirds of the replay (3.9 of 5.8 s of CPU; 31 µs of script time an `FCALL`), so the rate is mostly Redis' time a call, and that time is mostly its core waking cold. With two idle-priority busy loops (`chrt --idle 0`) keeping both cores from halting, 3 rounds alternating with and without: 20,000 to 22,100 requests a second against 17,200 to 18,900, and the `FCALL`'s script time 21 to 28 µs against 27 to 32. Not kept: a replay tool has no business burning the machine's idle time, and the gain is this virtual machine's. Pinning the simulator and its Redis to two different cores gave nothing measurable (4 alternating rounds).";

/// How many times each trace is replayed through sluice for the replay-rate table.
const REPLAY_RUNS: usize = 3;

fn replay_section(modules: &Modules) -> anyhow::Result<String> {
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
    for workload in &workloads {
        eprintln!("bench: replaying {} ...", workload.name);
        let r = replay::rate(modules, workload, REPLAY_RUNS)?;
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
    Ok(out)
}

fn deny_cache_section(modules: &Modules) -> anyhow::Result<String> {
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

/// Where the lease section's chart goes, beside BENCHMARKS.md.
const LEASE_CHART: &str = "bench/lease-hot-key.svg";

fn lease_section(modules: &Modules) -> anyhow::Result<String> {
    let workload = lease::workload();
    let rows = lease::run(modules, &workload, REPLAY_RUNS)?;
    std::fs::write(LEASE_CHART, lease::chart(&rows))?;
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
        "\n- *The bound* is the algorithm's own for one second (burst + rate x 1 s = 2,000), plus, with leases, the 500 units all Envoys may hold of one key (`docs/algorithms.md`). *Over the bound* counts admitted requests that took their key over it in the second ending with them.\n- *Denied though an exact limiter admits*: denied requests that an exact limit of 1,000 in any second, given what the key had admitted in the second before them, would have admitted (filling each free slot once). *Admitted over the exact limit*: the mirror image; `gcra`'s burst of 1,000 on top of its rate puts both modes over it at the start.\n- Decided request by request, which of a key's requests get in when it is 2.4 times over its limit is a coin toss that no two limiters toss alike: against the rule's own algorithm deciding every request in order, the per-request row differs on {} denials and the lease row on {} (of {} it admits), though both admit the limit, second by second ([chart]({LEASE_CHART})).\n",
        rows.first()
            .map_or(0, |r| r.accuracy.own_algorithm.denied_but_exact_admits),
        rows.last()
            .map_or(0, |r| r.accuracy.own_algorithm.denied_but_exact_admits),
        rows.last().map_or(0, |r| r.accuracy.own_algorithm.admitted),
    )?;
    writeln!(
        out,
        "![the hottest tenant's admissions in the trailing second, per request and with leases]({LEASE_CHART})\n"
    )?;
    Ok(out)
}

/// sluice-server beside the floor, where the floor was measured.
fn floor_table(out: &mut String, rows: &[server::Row]) -> anyhow::Result<()> {
    let measured: Vec<_> = rows
        .iter()
        .filter_map(|row| Some((row, row.floor()?)))
        .collect();
    if measured.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "\nThe floor (`bench/examples/floor.rs`): the least a server on the same stack can do, tokio and the Redis client on one thread, with no policy, body, clock or metrics. It reads each request with `httparse`, makes the very `FCALL` sluice-server makes for the check, and writes a canned answer. It is measured in sluice-server's place in the same rounds, under the same load, in turn right after sluice-server and right before it from round to round (whichever goes second in a round tends to run faster), and its ratio is taken to the same round's `EVALSHA`: what is between the two is what sluice's own code costs, and what is between the floor and 1 is the stack's and the machine's.\n"
    )?;
    writeln!(
        out,
        "| connections | checks/request | sluice-server decisions/s | ratio (median) | lowest .. highest | sluice-server µs | floor decisions/s | floor ratio (median) | lowest .. highest | floor µs |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|")?;
    for (row, floor) in measured {
        let r = row.median();
        let (lowest, highest) = row.ratio_range();
        writeln!(
            out,
            "| {} | {} | {:.0} | {:.2} | {lowest:.2} .. {highest:.2} | {:.1} | {:.0} | {:.2} | {:.2} .. {:.2} | {:.1} |",
            row.concurrency,
            row.checks,
            r.decisions_per_second(),
            r.ratio(),
            r.sluice_cpu_us()[1],
            floor.median.measured.rate() * row.checks as f64,
            floor.median.ratio,
            floor.lowest,
            floor.highest,
            floor.median.cpu.per_decision_us()[1],
        )?;
    }
    Ok(())
}

/// (connections, checks per request) measured by `make bench`.
const DEFAULT_LOAD: [(usize, usize); 4] = [(16, 1), (32, 1), (64, 1), (32, 3)];

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().find_map(|l| {
                l.strip_prefix("MemTotal:")?
                    .trim()
                    .trim_end_matches(" kB")
                    .parse::<f64>()
                    .ok()
            })
        })
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    format!("{cores} cores ({cpu}), {memory_gib:.0} GiB")
}

fn commit() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Command::Server {
            seconds,
            load,
            floor,
        } => {
            let load = load
                .iter()
                .map(|l| {
                    let (c, k) = l
                        .split_once(':')
                        .ok_or_else(|| anyhow::anyhow!("--load {l}: write connections:checks"))?;
                    Ok((c.parse()?, k.parse()?))
                })
                .collect::<anyhow::Result<Vec<(usize, usize)>>>()?;
            let floor_at: Vec<(usize, usize)> = if floor {
                load.iter().copied().filter(|&(_, k)| k == 1).collect()
            } else {
                Vec::new()
            };
            print!("{}", server_section(seconds, &load, &floor_at)?)
        }
        Command::Memory => print!("{}", runtime.block_on(memory::run())?),
        Command::Filter { rounds, profiles } => {
            print!("{}", filter_section(rounds, profiles.as_deref())?)
        }
        Command::FilterPass {
            filter,
            requests,
            answers,
        } => {
            let counts = filter::pass_from_file(filter, requests, &answers)?;
            eprintln!(
                "{} callouts, {} allowed, {} denied",
                counts.callouts, counts.allowed, counts.denied
            );
        }
        Command::Grpc { seconds } => print!("{}", grpc_section(seconds)?),
        Command::Replay => {
            let modules = Modules::built();
            print!("{}", replay_section(&modules)?);
            print!("{}", deny_cache_section(&modules)?);
        }
        Command::Lease => print!("{}", lease_section(&Modules::built())?),
        Command::All { out, seconds } => {
            let mut doc = String::new();
            writeln!(doc, "# Benchmarks\n")?;
            writeln!(
                doc,
                "Written by `make bench` on {}, commit {}, on {}. Every figure stands beside a baseline measured in the same run.\n",
                chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
                commit(),
                machine()
            )?;
            eprintln!("bench: sluice-server beside redis-benchmark ...");
            writeln!(
                doc,
                "## Server: decisions per second\n\n{}",
                server_section(seconds, &DEFAULT_LOAD, &FLOOR_LOAD)?
            )?;
            eprintln!("bench: the gRPC API beside /v1/decide ...");
            writeln!(
                doc,
                "## Server: Envoy's gRPC rate limit API beside /v1/decide\n\n{}",
                grpc_section(seconds)?
            )?;
            eprintln!("bench: Redis memory per key ...");
            writeln!(
                doc,
                "## Redis: memory per key and commands per decision\n\n{}",
                runtime.block_on(memory::run())?
            )?;
            eprintln!("bench: the filter beside a no-op filter ...");
            writeln!(
                doc,
                "## Filter: cost per request in wasmtime\n\n{}",
                filter_section(5, None)?
            )?;
            let modules = Modules::built();
            writeln!(
                doc,
                "## Simulator: replay rate\n\n{}",
                replay_section(&modules)?
            )?;
            writeln!(
                doc,
                "## Deny cache: an attack, with the cache on and off\n\n{}",
                deny_cache_section(&modules)?
            )?;
            writeln!(doc, "## Lease mode\n\n{}", lease_section(&modules)?)?;
            std::fs::write(&out, &doc)?;
            print!("{doc}");
            eprintln!("bench: written to {}", out.display());
        }
    }
    Ok(())
}
