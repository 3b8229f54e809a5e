//! sluice-server's decisions per second and latency, beside redis-benchmark running the same
//! script on the same Redis in the same run: by `EVALSHA`, and as sluice-server calls it, by
//! `FCALL` of its function.
//!
//! The server is the release binary, in its own process; the load generator holds a fixed
//! number of keep-alive connections (closed loop), as redis-benchmark holds its clients. Both
//! decide with the `gcra` script for keys spread over 10,000 clients. Load generator, server and
//! Redis share the machine, so the ratio says what the HTTP service costs over raw Redis here.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use sluice_core::key::{LimitKey, RuleName};
use sluice_core::limit::Limit;
use sluice_core::wire::{CheckTemplate, write_decide_request};
use sluice_harness::{RedisServer, cpu, free_port};
use sluice_sim::report::charts;

use crate::load::{self, Measured};

mod process;
mod redis_side;
mod workload;

pub(crate) use self::process::{ServerProcess, wait_ready};
use self::redis_side::Call;
pub use self::redis_side::{BenchmarkRun, RedisWork};
use self::workload::KEYSPACE;
pub(crate) use self::workload::{BUSY_POLL_US, LIMIT, Standin};

/// One run of one configuration: redis-benchmark's `EVALSHA`, sluice (and the stand-ins where
/// they are measured), `EVALSHA` again, then `FCALL`.
#[derive(Debug, Clone)]
pub struct Run {
    /// sluice-server's side.
    pub sluice: Measured,
    /// The CPU sluice's side spent on it (warm-up included).
    pub sluice_cpu: SluiceCpu,
    /// The stand-ins in sluice-server's place, under the same load, with the CPU spent on each.
    pub standins: Vec<(Standin, Measured, SluiceCpu)>,
    /// redis-benchmark's `EVALSHA`, right before sluice's side and right after it.
    pub baseline: [BenchmarkRun; 2],
    /// redis-benchmark's `FCALL`, after the second `EVALSHA`.
    pub fcall: BenchmarkRun,
    /// Checks in each request.
    checks: usize,
}

impl Run {
    /// Decisions per second (checks decided).
    pub fn decisions_per_second(&self) -> f64 {
        self.sluice.rate() * self.checks as f64
    }

    /// `EVALSHA` calls per second: the mean of the runs before and after sluice's side, so
    /// that neither the order nor a drift over the round favours one side.
    pub fn baseline_rate(&self) -> f64 {
        self.baseline.iter().map(|b| b.rate).sum::<f64>() / self.baseline.len() as f64
    }

    /// The p99 latency of `EVALSHA` (ms), the mean of the two runs'.
    pub fn baseline_p99_ms(&self) -> f64 {
        self.baseline.iter().map(|b| b.p99_ms).sum::<f64>() / self.baseline.len() as f64
    }

    /// sluice's decisions per second over raw EVALSHA per second.
    pub fn ratio(&self) -> f64 {
        self.decisions_per_second() / self.baseline_rate()
    }

    /// sluice's decisions per second over raw FCALL per second.
    pub fn fcall_ratio(&self) -> f64 {
        self.decisions_per_second() / self.fcall.rate
    }

    /// CPU microseconds a decision on sluice's side: load generator, server, Redis.
    pub fn sluice_cpu_us(&self) -> [f64; 3] {
        self.sluice_cpu.per_decision_us()
    }

    /// CPU microseconds a decision by redis-benchmark's `EVALSHA`, over both its runs:
    /// redis-benchmark, Redis.
    pub fn baseline_cpu_us(&self) -> [f64; 2] {
        let both = RedisWork {
            cpu_s: self.baseline.iter().map(|b| b.redis.cpu_s).sum(),
            decisions: self.baseline.iter().map(|b| b.redis.decisions).sum(),
        };
        let client_s = self.baseline.iter().map(|b| b.client_cpu_s).sum();
        [both.per_decision_us(client_s), both.cpu_us_per_decision()]
    }
}

/// CPU spent on sluice's side of a run: seconds, user and system, of the load generator and
/// the server, and what Redis did meanwhile.
#[derive(Debug, Clone, Copy, Default)]
pub struct SluiceCpu {
    /// The load generator (its one thread).
    pub client_s: f64,
    /// The sluice-server process.
    pub server_s: f64,
    /// Redis.
    pub redis: RedisWork,
}

impl SluiceCpu {
    /// Runs `load` on this thread, the load generator's, and returns what it gave with the
    /// CPU that it, `server` and `redis` spent meanwhile.
    pub(crate) fn during<T>(
        redis: &RedisServer,
        server: &ServerProcess,
        load: impl FnOnce() -> anyhow::Result<T>,
    ) -> anyhow::Result<(T, SluiceCpu)> {
        let ((out, client_s, server_s), redis) = RedisWork::during(redis, || {
            let client = cpu::this_thread()?;
            let serving = cpu::process(server.pid())?;
            let out = load()?;
            Ok((
                out,
                cpu::this_thread()? - client,
                cpu::process(server.pid())? - serving,
            ))
        })?;
        Ok((
            out,
            SluiceCpu {
                client_s,
                server_s,
                redis,
            },
        ))
    }

    /// CPU microseconds a decision (as Redis counted them): load generator, server, Redis.
    pub fn per_decision_us(&self) -> [f64; 3] {
        [
            self.redis.per_decision_us(self.client_s),
            self.redis.per_decision_us(self.server_s),
            self.redis.cpu_us_per_decision(),
        ]
    }
}

/// One measured configuration: its runs, ordered by ratio.
#[derive(Debug, Clone)]
pub struct Row {
    /// Connections.
    pub concurrency: usize,
    /// Checks in each request.
    pub checks: usize,
    /// Each run, lowest ratio first.
    pub runs: Vec<Run>,
}

impl Row {
    /// The run of median ratio.
    pub fn median(&self) -> &Run {
        &self.runs[self.runs.len() / 2]
    }

    /// The lowest and the highest ratio.
    pub fn ratio_range(&self) -> (f64, f64) {
        let ratio = |r: Option<&Run>| r.map_or(f64::NAN, Run::ratio);
        (ratio(self.runs.first()), ratio(self.runs.last()))
    }

    /// Where `standin` was measured: its run of median ratio, with the lowest and highest.
    pub fn standin(&self, standin: Standin) -> Option<StandinSummary<'_>> {
        let mut runs: Vec<StandinRun<'_>> = self
            .runs
            .iter()
            .filter_map(|run| {
                let (_, measured, cpu) = run.standins.iter().find(|(s, ..)| *s == standin)?;
                Some(StandinRun {
                    measured,
                    cpu,
                    ratio: measured.rate() * self.checks as f64 / run.baseline_rate(),
                })
            })
            .collect();
        runs.sort_by(|a, b| a.ratio.total_cmp(&b.ratio));
        Some(StandinSummary {
            lowest: runs.first()?.ratio,
            highest: runs.last()?.ratio,
            median: runs.swap_remove(runs.len() / 2),
        })
    }
}

/// One run of a stand-in, with its ratio to the same round's `EVALSHA`.
pub struct StandinRun<'a> {
    /// Its load's answers.
    pub measured: &'a Measured,
    /// The CPU its side spent.
    pub cpu: &'a SluiceCpu,
    /// Its decisions per second over raw EVALSHA per second.
    pub ratio: f64,
}

/// A stand-in's runs in one configuration.
pub struct StandinSummary<'a> {
    /// The run of median ratio.
    pub median: StandinRun<'a>,
    /// The lowest ratio.
    pub lowest: f64,
    /// The highest ratio.
    pub highest: f64,
}

/// Each configuration's CPU a decision (its median run), sluice's side beside the baseline's, as
/// SVG.
pub fn cpu_chart(rows: &[Row]) -> String {
    let categories: Vec<String> = rows
        .iter()
        .map(|r| {
            let checks = if r.checks == 1 { "check" } else { "checks" };
            format!("{} conn., {} {checks}", r.concurrency, r.checks)
        })
        .collect();
    let sluice: Vec<[f64; 3]> = rows.iter().map(|r| r.median().sluice_cpu_us()).collect();
    let baseline: Vec<[f64; 2]> = rows.iter().map(|r| r.median().baseline_cpu_us()).collect();
    let stacks = [
        charts::Stack {
            segments: vec![
                ("load generator", sluice.iter().map(|s| s[0]).collect()),
                ("sluice-server", sluice.iter().map(|s| s[1]).collect()),
                ("Redis", sluice.iter().map(|s| s[2]).collect()),
            ],
        },
        charts::Stack {
            segments: vec![
                ("redis-benchmark", baseline.iter().map(|b| b[0]).collect()),
                ("Redis", baseline.iter().map(|b| b[1]).collect()),
            ],
        },
    ];
    charts::stacked_bars(
        "CPU a decision: sluice (left bar) and redis-benchmark EVALSHA (right bar)",
        "µs of CPU a decision",
        &categories,
        &stacks,
    )
}

/// The client key of the `i`th request: every key of the keyspace, in a scrambled order.
pub(crate) fn client_key(i: u64) -> u64 {
    i.wrapping_mul(2_654_435_761) % KEYSPACE
}

/// One request body per client key, in a scrambled order, written as the filter writes them.
pub(crate) fn bodies(checks: usize) -> anyhow::Result<Vec<Bytes>> {
    let limit: Limit = serde_json::from_str(LIMIT)?;
    let templates = (0..checks)
        .map(|c| {
            let rule = RuleName::new(format!("bench{c}"))?;
            Ok(CheckTemplate::new(&rule, &limit, 1, false, false))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((0..KEYSPACE)
        .map(|i| {
            let key = LimitKey::from_parts([format!("client-{}", client_key(i)).as_bytes()]);
            let mut body = Vec::new();
            write_decide_request(&mut body, templates.iter().map(|t| (t, &key)));
            Bytes::from(body)
        })
        .collect())
}

/// Measures each (concurrency, checks per request) `repeats` times, for `duration` after a
/// warm-up each time; each run sets sluice between two runs of redis-benchmark's `EVALSHA`,
/// each about as long, and then runs its `FCALL`. In the configurations of `standins_at` (one
/// check a request), each [`Standin`] is measured in sluice-server's place too, between the
/// same two `EVALSHA` runs, the servers taking turns to go first, and every run lasts
/// `standin_duration` instead.
pub fn run(
    configurations: &[(usize, usize)],
    duration: Duration,
    repeats: usize,
    standins_at: &[(usize, usize)],
    standin_duration: Duration,
) -> anyhow::Result<Vec<Row>> {
    if let Some((c, k)) = standins_at.iter().find(|(_, checks)| *checks != 1) {
        bail!("the floor makes one check a request, not {k} (at {c} connections)");
    }
    let redis = RedisServer::start()?;
    let local = |port| SocketAddr::from(([127, 0, 0, 1], port));
    let addr = local(free_port()?);
    let server = ServerProcess::start(addr, &redis, &[])?;
    let mut standins = Vec::new();
    if !standins_at.is_empty() {
        for standin in Standin::ALL {
            let standin_addr = local(free_port()?);
            let process = ServerProcess::standin(standin, standin_addr, &redis)?;
            standins.push((standin, standin_addr, process));
        }
    }
    // The load generator gets one thread, as redis-benchmark has one.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(wait_ready(addr))?;
    for (_, standin_addr, _) in &standins {
        runtime.block_on(wait_ready(*standin_addr))?;
    }
    let mut rows = Vec::new();
    for &(concurrency, checks) in configurations {
        let bodies = bodies(checks)?;
        let with_standins = standins_at.contains(&(concurrency, checks));
        let duration = if with_standins {
            standin_duration
        } else {
            duration
        };
        let load_on = |addr, server: &ServerProcess| {
            let (measured, cpu) = SluiceCpu::during(&redis, server, || {
                runtime.block_on(load::run(
                    addr,
                    sluice_core::wire::DECIDE_PATH,
                    concurrency,
                    Duration::from_secs(1),
                    duration,
                    &bodies,
                ))
            })?;
            if measured.errors > 0 {
                bail!("{} requests failed during the benchmark", measured.errors);
            }
            Ok((measured, cpu))
        };
        // redis-benchmark warms Redis up before the first round, as the load generator's first
        // second does for sluice's side, and tells how many calls fill a measured span.
        let warm_up = BenchmarkRun::measure(&redis, concurrency, 50_000, Call::Eval)?;
        let mut requests = ((warm_up.rate * duration.as_secs_f64()) as u64).max(50_000);
        let mut runs = Vec::with_capacity(repeats);
        // The first configuration starts with a round that is not counted: the machine is
        // still settling from what ran before (after a build, the first round's EVALSHA ran at
        // 62.7k calls a second and the same round's last at 70.2k; sluice-server, first in
        // it, at 0.87 of their mean against 0.94 and 0.95 in the next two; 2026-11-26).
        let settling = usize::from(rows.is_empty());
        for round in 0..repeats.max(1) + settling {
            let before = BenchmarkRun::measure(&redis, concurrency, requests, Call::Eval)?;
            // Whichever server goes later in a round tends to run faster (the same binary in
            // two places: up to 0.12 of the ratio, 2026-11-25), so rounds take turns: sluice
            // goes first, then second, and so on.
            let mut order: Vec<Option<usize>> = std::iter::once(None)
                .chain((0..standins.len()).map(Some))
                .collect();
            if with_standins {
                let turn = round % order.len();
                order.rotate_right(turn);
            } else {
                order.truncate(1);
            }
            let mut sluice = None;
            let mut measured_standins = Vec::new();
            for server_index in order {
                match server_index {
                    None => sluice = Some(load_on(addr, &server)?),
                    Some(i) => {
                        let (standin, standin_addr, process) = &standins[i];
                        let (measured, cpu) = load_on(*standin_addr, process)?;
                        measured_standins.push((*standin, measured, cpu));
                    }
                }
            }
            let (sluice, sluice_cpu) = sluice.context("sluice-server was not measured")?;
            let after = BenchmarkRun::measure(&redis, concurrency, requests, Call::Eval)?;
            let fcall = BenchmarkRun::measure(&redis, concurrency, requests, Call::Function)?;
            requests = ((after.rate * duration.as_secs_f64()) as u64).max(50_000);
            if round < settling {
                continue;
            }
            runs.push(Run {
                sluice,
                sluice_cpu,
                standins: measured_standins,
                baseline: [before, after],
                fcall,
                checks,
            });
        }
        runs.sort_by(|a, b| a.ratio().total_cmp(&b.ratio()));
        rows.push(Row {
            concurrency,
            checks,
            runs,
        });
    }
    drop((server, standins));
    Ok(rows)
}
