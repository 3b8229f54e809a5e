//! The `sluice-sim` binary: replay a trace, compare the algorithms on one, generate one, or
//! check a configuration. A thin shell over the library's [`session`](sluice_sim::session).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use sluice_core::duration::Millis;
use sluice_host::envoy::FailurePolicy;
use sluice_sim::compare::{self, Comparison, Nominal};
use sluice_sim::replay::Clock;
use sluice_sim::report::{Latency, html};
use sluice_sim::session::{self, Outcome, Setup};
use sluice_sim::trace::synthetic::{self, GenOptions, Kind};
use sluice_sim::trace::timing::Spread;
use sluice_sim::trace::{self, Format, ReadOptions, Trace};
use sluice_sim::{EXAMPLE_POLICY, Simulation, Topology};

// The replay allocates per request on two threads (VMs, HTTP, Redis); mimalloc's thread-local
// heaps keep that off the critical path (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Replay a trace through every algorithm at one rate, side by side.
    Compare(CompareArgs),
    /// Write a synthetic trace.
    Gen(GenArgs),
    /// Load the filter with a configuration, as Envoy would, and say whether it is accepted.
    Check(CheckArgs),
}

#[derive(Args)]
struct TraceArgs {
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
}

#[derive(Args)]
struct RunArgs {
    /// The filter (.wasm).
    #[arg(long, env = "SLUICE_WASM")]
    wasm: Option<PathBuf>,
    /// A Redis to use (default: start a redis-server on a free port).
    #[arg(long)]
    redis: Option<String>,
    /// A sluice-server in replay mode to use (default: start one in this process).
    #[arg(long)]
    server: Option<String>,
    /// Envoy instances sharing the server and Redis (requests go round robin).
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// Worker threads (VMs) per Envoy.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Skip the filter when its VM fails, instead of answering 503.
    #[arg(long, conflicts_with = "fail_reload")]
    fail_open: bool,
    /// When a worker's VM fails, answer 503 and give the worker a new VM on the first request
    /// at least this long after the last load (Envoy's FAIL_RELOAD and its backoff's
    /// base_interval, e.g. 1s).
    #[arg(long)]
    fail_reload: Option<Millis>,
    /// In virtual time: the modelled time from a callout to its answer.
    #[arg(long, default_value = "1ms")]
    callout_latency: Millis,
    /// Replay in real time, paced at this many trace seconds per second (e.g. 1, or 60),
    /// instead of in virtual time; the report then gives measured callout latencies.
    #[arg(long)]
    speed: Option<f64>,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the report as an HTML page with charts here.
    #[arg(long)]
    html: Option<PathBuf>,
    /// How many of the most limited keys to list.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct ReplayArgs {
    /// The filter's configuration (default: examples/policy.json, compiled in).
    #[arg(long)]
    policy: Option<PathBuf>,
    #[command(flatten)]
    trace: TraceArgs,
    /// Spread the requests of each timestamp step over the step (auto: when the timestamps
    /// are only real to the minute or the hour).
    #[arg(long, value_enum, default_value_t = Spread::Auto)]
    spread: Spread,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct CompareArgs {
    /// The nominal rate, as units/period: 10/1s, 600/1m.
    #[arg(long, default_value = "10/1s")]
    rate: Nominal,
    /// What one limit counts, as the policy's key parts in JSON.
    #[arg(long, default_value = r#"["client_ip"]"#)]
    key: String,
    /// The lease horizon of each algorithm's leased twin (the lease columns).
    #[arg(long, default_value = "200ms")]
    lease_horizon: Millis,
    /// Leave out the leased twins.
    #[arg(long)]
    no_lease: bool,
    #[command(flatten)]
    trace: TraceArgs,
    /// Spread the requests of each timestamp step over the step. By default they are spread
    /// evenly: logs record seconds, and a fixed window's boundary burst lives inside them.
    #[arg(long, value_enum, default_value_t = Spread::Even)]
    spread: Spread,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
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

#[derive(Args)]
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
        Command::Replay(args) => replay(&args),
        Command::Compare(args) => compare(&args),
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

fn load_trace(args: &TraceArgs, spread: Spread) -> anyhow::Result<Trace> {
    match &args.trace {
        Some(path) => Ok(trace::read_file(
            path,
            ReadOptions {
                format: args.format,
                skip_bad: args.skip_bad,
                sort: args.sort,
                spread,
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

fn setup(run: &RunArgs, policy: Vec<u8>, policy_name: String) -> anyhow::Result<Setup> {
    if let Some(speed) = run.speed
        && !(speed.is_finite() && speed > 0.0)
    {
        bail!("--speed {speed}: give a positive factor, e.g. 1 (as recorded) or 60");
    }
    Ok(Setup {
        wasm: find_wasm(run.wasm.as_deref())?,
        policy,
        policy_name,
        topology: Topology {
            instances: run.instances.max(1),
            workers: run.workers.max(1),
            failure_policy: match (run.fail_open, run.fail_reload) {
                (true, _) => FailurePolicy::FailOpen,
                (false, Some(backoff)) => FailurePolicy::FailReload {
                    backoff_ms: backoff.as_millis(),
                },
                (false, None) => FailurePolicy::FailClosed,
            },
            clock: match run.speed {
                Some(speed) => Clock::RealTime { speed },
                None => Clock::Virtual {
                    callout_latency: Duration::from_millis(run.callout_latency.as_millis()),
                },
            },
        },
        redis: run.redis.clone(),
        server: run.server.clone(),
        top: run.top,
    })
}

/// Runs a session with a progress bar on a terminal.
fn run_session(setup: &Setup, trace: &Trace, quiet: bool) -> anyhow::Result<Outcome> {
    let bar = if quiet || !std::io::stderr().is_terminal() {
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
    let outcome = session::run(setup, trace, &mut |n| bar.set_position(n as u64));
    bar.finish_and_clear();
    outcome
}

/// What only this run's machine knows: how fast it went.
fn wall_line(outcome: &Outcome) {
    let stats = &outcome.stats;
    let seconds = stats.wall.as_secs_f64().max(1e-9);
    let mut line = format!(
        "  replayed in {seconds:.1}s ({:.0} requests/s)",
        stats.requests as f64 / seconds
    );
    if outcome.report.latency.is_none()
        && let Some(l) = Latency::of(&outcome.recorder.sorted_latencies())
    {
        line.push_str(&format!(
            "; server decision time p50 {:.2} ms, p99 {:.2} ms",
            l.p50_ms, l.p99_ms
        ));
    }
    println!("{line}");
}

fn write(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

fn replay(args: &ReplayArgs) -> anyhow::Result<()> {
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
    let trace = load_trace(&args.trace, args.spread)?;
    let setup = setup(&args.run, policy, policy_name)?;
    let outcome = run_session(&setup, &trace, args.run.quiet)?;
    let report = &outcome.report;
    let rendered = report.render();
    let (head, rest) = rendered.split_once("\n\n").unwrap_or((&rendered, ""));
    println!("{head}");
    wall_line(&outcome);
    println!();
    print!("{rest}");
    if let Some(path) = &args.run.json {
        write(path, &serde_json::to_vec_pretty(report)?)?;
    }
    if let Some(path) = &args.run.html {
        write(path, html::page(report).as_bytes())?;
    }
    Ok(())
}

fn compare(args: &CompareArgs) -> anyhow::Result<()> {
    let key: serde_json::Value = serde_json::from_str(&args.key)
        .with_context(|| format!("--key {}: not JSON, e.g. [\"client_ip\"]", args.key))?;
    let horizon = (!args.no_lease).then_some(args.lease_horizon);
    let policy = compare::policy(args.rate, &key, "sluice", horizon);
    let trace = load_trace(&args.trace, args.spread)?;
    let setup = setup(
        &args.run,
        policy.into_bytes(),
        format!("every algorithm at {} per {}", args.rate, args.key),
    )?;
    let outcome = run_session(&setup, &trace, args.run.quiet)?;
    let comparison = Comparison::build(args.rate, &outcome.report, &outcome.recorder);
    let rendered = outcome.report.render();
    let (head, _) = rendered.split_once("\n\n").unwrap_or((&rendered, ""));
    println!("{head}");
    wall_line(&outcome);
    println!();
    print!("{}", comparison.render());
    if let Some(path) = &args.run.json {
        let json = serde_json::json!({"comparison": comparison, "report": outcome.report});
        write(path, &serde_json::to_vec_pretty(&json)?)?;
    }
    if let Some(path) = &args.run.html {
        let mut page = html::open(&format!("sluice-sim: every algorithm at {}", args.rate));
        page.push_str(&format!(
            "<p>{} requests from <code>{}</code>; {}.</p>\n",
            outcome.report.trace.requests,
            html::escape(&outcome.report.trace.source),
            html::escape(&outcome.report.trace.timing.describe())
        ));
        page.push_str(&comparison.html());
        page.push_str(html::close());
        write(path, page.as_bytes())?;
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
