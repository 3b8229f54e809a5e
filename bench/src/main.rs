//! `sluice-bench`: what `make bench` runs. Each figure is measured beside its baseline in the
//! same run, because these machines are noisy; `all` writes them to BENCHMARKS.md.

mod load;
mod memory;
mod server;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

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
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Configurations as connections:checks, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "16:1,32:1,64:1,32:3")]
        load: Vec<String>,
    },
    /// Redis memory per key and commands per decision, for each algorithm.
    Memory,
    /// Everything, written to a Markdown file.
    All {
        /// Where to write the results.
        #[arg(long, default_value = "BENCHMARKS.md")]
        out: PathBuf,
        /// Seconds per server measurement.
        #[arg(long, default_value_t = 5)]
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

fn server_section(seconds: u64, load: &[(usize, usize)]) -> anyhow::Result<String> {
    let rows = server::run(load, Duration::from_secs(seconds))?;
    let mut out = String::new();
    writeln!(
        out,
        "The release `sluice-server` binary in its own process, deciding `gcra` for keys spread over 10,000 clients, under a closed-loop load of keep-alive HTTP/1.1 connections; beside it, `redis-benchmark` with as many connections running `EVALSHA` of the same script on the same Redis. Ratio: sluice's decisions per second over redis-benchmark's `EVALSHA` per second. Load generator, server and Redis share the machine.\n"
    )?;
    writeln!(
        out,
        "| connections | checks/request | requests/s | decisions/s | p50 ms | p99 ms | redis-benchmark EVALSHA/s | its p50 ms | its p99 ms | ratio |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|")?;
    for r in rows {
        writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {:.3} | {:.3} | {:.0} | {:.3} | {:.3} | {:.2} |",
            r.concurrency,
            r.checks,
            r.sluice.rate(),
            r.decisions_per_second(),
            r.sluice.quantile_ms(0.5),
            r.sluice.quantile_ms(0.99),
            r.baseline.0,
            r.baseline.1,
            r.baseline.2,
            r.ratio()
        )?;
    }
    Ok(out)
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
        Command::Server { seconds, load } => {
            let load = load
                .iter()
                .map(|l| {
                    let (c, k) = l
                        .split_once(':')
                        .ok_or_else(|| anyhow::anyhow!("--load {l}: write connections:checks"))?;
                    Ok((c.parse()?, k.parse()?))
                })
                .collect::<anyhow::Result<Vec<(usize, usize)>>>()?;
            print!("{}", server_section(seconds, &load)?)
        }
        Command::Memory => print!("{}", runtime.block_on(memory::run())?),
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
                server_section(seconds, &DEFAULT_LOAD)?
            )?;
            eprintln!("bench: Redis memory per key ...");
            writeln!(
                doc,
                "## Redis: memory per key and commands per decision\n\n{}",
                runtime.block_on(memory::run())?
            )?;
            std::fs::write(&out, &doc)?;
            print!("{doc}");
            eprintln!("bench: written to {}", out.display());
        }
    }
    Ok(())
}
