//! The `sluice-sim` binary: replay a trace, generate one, or check a configuration.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use sluice_core::duration::Millis;
use sluice_sim::envoy::{Completed, FailurePolicy};
use sluice_sim::launch::Services;
use sluice_sim::replay::Observer;
use sluice_sim::report::Collector;
use sluice_sim::trace::synthetic::{self, GenOptions, Kind};
use sluice_sim::trace::{self, Format, ReadOptions, Trace, TraceRecord};
use sluice_sim::{EXAMPLE_POLICY, Simulation, Topology};

#[derive(Parser)]
#[command(
    name = "sluice-sim",
    version,
    about = "Replays traffic through the sluice filter as Envoy hosts it, via sluice-server, into Redis."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a trace and report what every rule did.
    Replay(ReplayArgs),
    /// Write a synthetic trace.
    Gen(GenArgs),
    /// Load the filter with a configuration, as Envoy would, and say whether it is accepted.
    Check(CheckArgs),
}

#[derive(clap::Args)]
struct ReplayArgs {
    /// The filter's configuration (default: examples/policy.json, compiled in).
    #[arg(long)]
    policy: Option<PathBuf>,
    /// The trace (default: a synthetic demo trace, 10 minutes of visitors and crawlers).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// The trace's format.
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    format: Format,
    /// Sort a trace whose lines are out of time order (instead of refusing it).
    #[arg(long)]
    sort: bool,
    /// Skip lines that cannot be read (counted), instead of stopping at the first.
    #[arg(long)]
    skip_bad: bool,
    /// The filter (.wasm).
    #[arg(long, env = "SLUICE_WASM")]
    wasm: Option<PathBuf>,
    /// A Redis to use (default: start a redis-server on a free port).
    #[arg(long)]
    redis: Option<String>,
    /// A sluice-server in replay mode to use (default: start one in this process).
    #[arg(long)]
    server: Option<String>,
    /// Envoy instances sharing the server and Redis.
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// Worker threads (VMs) per Envoy.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Skip the filter when its VM fails, instead of answering 503.
    #[arg(long)]
    fail_open: bool,
    /// The modelled time from a callout to its answer (virtual time).
    #[arg(long, default_value = "1ms")]
    callout_latency: Millis,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// How many of the most limited keys to list.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(clap::Args)]
struct GenArgs {
    /// The kind of traffic.
    #[arg(long, value_enum, default_value_t = Kind::Demo)]
    kind: Kind,
    /// How long the trace lasts (e.g. 10m).
    #[arg(long, default_value = "10m")]
    duration: Millis,
    /// The seed: the same seed gives the same trace.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stop after this many requests (0: no limit).
    #[arg(long, default_value_t = 0)]
    requests: usize,
    /// Multiply every client's rate.
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Where to write the trace (JSON lines); `-` for standard output.
    #[arg(long, default_value = "-")]
    out: PathBuf,
}

#[derive(clap::Args)]
struct CheckArgs {
    /// The configuration to check.
    #[arg(long)]
    policy: PathBuf,
    /// The filter (.wasm).
    #[arg(long, env = "SLUICE_WASM")]
    wasm: Option<PathBuf>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("SLUICE_SIM_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Replay(args) => replay(args),
        Command::Gen(args) => generate(&args),
        Command::Check(args) => check(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice-sim: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Where the filter is: `--wasm`, else the workspace's build output next to this binary or
/// under the current directory.
fn find_wasm(given: Option<&Path>) -> anyhow::Result<Vec<u8>> {
    const BUILT: &str = "wasm32-wasip1/wasm/sluice_filter.wasm";
    let mut candidates: Vec<PathBuf> = given.map(Path::to_path_buf).into_iter().collect();
    if given.is_none() {
        if let Ok(exe) = std::env::current_exe()
            && let Some(target) = exe.parent().and_then(Path::parent)
        {
            candidates.push(target.join(BUILT));
        }
        candidates.push(Path::new("target").join(BUILT));
    }
    for path in &candidates {
        if let Ok(bytes) = std::fs::read(path) {
            return Ok(bytes);
        }
    }
    bail!(
        "no filter found at {}: build it with `make wasm`, or pass --wasm FILE",
        candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" or ")
    )
}

struct Terminal {
    collector: Collector,
    bar: ProgressBar,
}

impl Observer for Terminal {
    fn completed(&mut self, _instance: usize, done: Completed, _record: &TraceRecord) {
        self.collector.add(&done);
    }

    fn progress(&mut self, processed: usize) {
        self.bar.set_position(processed as u64);
    }
}

fn load_trace(args: &ReplayArgs) -> anyhow::Result<Trace> {
    match &args.trace {
        Some(path) => Ok(trace::read_file(
            path,
            ReadOptions {
                format: args.format,
                skip_bad: args.skip_bad,
                sort: args.sort,
            },
        )?),
        None => Ok(Trace {
            source: "synthetic demo trace (sluice-sim gen --kind demo --duration 10m --seed 1)"
                .to_owned(),
            records: synthetic::generate(GenOptions {
                kind: Kind::Demo,
                seconds: 600,
                seed: 1,
                max_requests: 0,
                rate_scale: 1.0,
            }),
            ..Trace::default()
        }),
    }
}

fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    let (policy, policy_name) = match &args.policy {
        Some(path) => (
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
            path.display().to_string(),
        ),
        None => (
            EXAMPLE_POLICY.as_bytes().to_vec(),
            "examples/policy.json (built in)".to_owned(),
        ),
    };
    let wasm = find_wasm(args.wasm.as_deref())?;
    let trace = load_trace(&args)?;
    let simulation = Simulation::new(&wasm, &policy)?;
    let topology = Topology {
        instances: args.instances.max(1),
        workers: args.workers.max(1),
        failure_policy: if args.fail_open {
            FailurePolicy::FailOpen
        } else {
            FailurePolicy::FailClosed
        },
        callout_latency: Duration::from_millis(args.callout_latency.as_millis()),
    };
    // The replay (the VMs) runs on this thread; the callouts and the in-process server share
    // one more, so that a callout reaches the server without a thread switch.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let services = Services::start(&runtime, args.redis.clone(), args.server.clone())?;

    let bar = if args.quiet || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(trace.records.len() as u64)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} replaying [{bar:40}] {pos}/{len} requests ({per_sec}, {eta} left)",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let mut terminal = Terminal {
        collector: Collector::default(),
        bar,
    };
    let run = simulation.run(
        &trace.records,
        &topology,
        services.endpoint(),
        &runtime,
        &mut terminal,
    );
    terminal.bar.finish_and_clear();
    services.stop(&runtime);
    let run = run?;

    let summary = terminal.collector.report(args.top, &run.clients);
    let first = trace.records.first().map_or(0, |r| r.time_us);
    let last = trace.records.last().map_or(0, |r| r.time_us);
    println!(
        "sluice-sim: {} requests from {}",
        run.stats.requests, trace.source
    );
    println!(
        "  {} .. {} ({:.1} min of traffic){}",
        trace::format_time(first),
        trace::format_time(last),
        (last - first) as f64 / 60e6,
        if trace.reordered > 0 {
            format!("; {} out-of-order lines sorted", trace.reordered)
        } else {
            String::new()
        }
    );
    if trace.skipped > 0 {
        println!(
            "  {} unreadable lines skipped, e.g. {}",
            trace.skipped,
            trace
                .skipped_examples
                .first()
                .map(ToString::to_string)
                .unwrap_or_default()
        );
    }
    println!(
        "  policy {policy_name}; {} Envoy x {} worker; {} callouts; replayed in {:.1}s ({:.0} requests/s)",
        topology.instances,
        topology.workers,
        run.stats.callouts,
        run.stats.wall.as_secs_f64(),
        run.stats.requests as f64 / run.stats.wall.as_secs_f64().max(1e-9)
    );
    if run.stats.open_at_end > 0 {
        println!(
            "  {} requests never finished (hung streams)",
            run.stats.open_at_end
        );
    }
    for (i, envoy) in run.envoys.iter().enumerate() {
        for worker in 0..envoy.workers() {
            if let Some(failure) = envoy.failed(worker) {
                println!("  Envoy {i} worker {worker}: the VM failed: {failure}");
            }
        }
    }
    println!();
    print!("{}", summary.render());
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "trace": {"source": trace.source, "requests": trace.records.len(), "skipped": trace.skipped, "reordered": trace.reordered},
            "topology": {"instances": topology.instances, "workers": topology.workers},
            "callouts": run.stats.callouts,
            "summary": summary,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn generate(args: &GenArgs) -> anyhow::Result<()> {
    let records = synthetic::generate(GenOptions {
        kind: args.kind,
        seconds: args.duration.as_millis().div_ceil(1000),
        seed: args.seed,
        max_requests: args.requests,
        rate_scale: args.scale,
    });
    if args.out.as_os_str() == "-" {
        let stdout = std::io::stdout();
        trace::jsonl::write(&mut std::io::BufWriter::new(stdout.lock()), &records)?;
    } else {
        let file = std::fs::File::create(&args.out)
            .with_context(|| format!("creating {}", args.out.display()))?;
        let mut out = std::io::BufWriter::new(file);
        trace::jsonl::write(&mut out, &records)?;
        eprintln!("wrote {} requests to {}", records.len(), args.out.display());
    }
    Ok(())
}

fn check(args: &CheckArgs) -> anyhow::Result<()> {
    let policy = std::fs::read(&args.policy)
        .with_context(|| format!("reading {}", args.policy.display()))?;
    let wasm = find_wasm(args.wasm.as_deref())?;
    let simulation = Simulation::new(&wasm, &policy)?;
    simulation.envoys(&Topology::default(), 0)?;
    println!("{}: accepted by the filter", args.policy.display());
    Ok(())
}
