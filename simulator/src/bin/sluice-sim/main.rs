//! The `sluice-sim` binary: replay a trace, compare the algorithms on one, generate one, or
//! check a configuration. A thin shell over the library's [`session`](sluice_sim::session);
//! the flags are in `args.rs`.

mod args;

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use sluice_sim::compare::{self, Comparison};
use sluice_sim::native::NativeConfig;
use sluice_sim::quota::QuotaConfig;
use sluice_sim::report::{Latency, html};
use sluice_sim::session::{self, Outcome, Setup};
use sluice_sim::trace::synthetic::{self, GenOptions};
use sluice_sim::trace::{self, Trace};
use sluice_sim::{EXAMPLE_POLICY, Simulation, Topology};

use self::args::{
    CheckArgs, Cli, Command, CompareArgs, GenArgs, ReplayArgs, RunArgs, find_wasm, load_trace,
    native_session, quota_session, setup,
};

// The replay allocates per request on two threads (VMs, HTTP, Redis); mimalloc's thread-local
// heaps keep that off the critical path (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

/// Runs a session with a progress bar on a terminal.
fn run_session(setup: &Setup, trace: &Trace, quiet: bool) -> anyhow::Result<Outcome> {
    let bar = progress_bar(trace.records.len() as u64, quiet);
    let outcome = session::run(setup, trace, &mut |n| bar.set_position(n as u64));
    bar.finish_and_clear();
    outcome
}

fn progress_bar(requests: u64, quiet: bool) -> ProgressBar {
    let bar = if quiet || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(requests)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} replaying [{bar:40}] {pos}/{len} requests ({per_sec}, {eta} left)",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar
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
    if let Some(envoy_config) = &args.envoy_config {
        return replay_native(args, envoy_config);
    }
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
    print_outcome(&outcome, &args.run)
}

/// A replay through the model of Envoy's native `ratelimit` or `rate_limit_quota` filter.
fn replay_native(args: &ReplayArgs, envoy_config: &Path) -> anyhow::Result<()> {
    if !args.rlqs_config.is_empty() {
        let text = std::fs::read_to_string(envoy_config)
            .with_context(|| format!("reading {}", envoy_config.display()))?;
        let config =
            QuotaConfig::parse(&text).with_context(|| format!("{}", envoy_config.display()))?;
        let session = quota_session(&args.run, config, envoy_config, &args.rlqs_config)?;
        let trace = load_trace(&args.trace, args.spread)?;
        let bar = progress_bar(trace.records.len() as u64, args.run.quiet);
        let outcome =
            sluice_sim::quota::session::run(&session, &trace, &mut |n| bar.set_position(n as u64));
        bar.finish_and_clear();
        return print_outcome(&outcome?, &args.run);
    }
    if args.rls_config.is_empty() {
        anyhow::bail!(
            "--envoy-config: give the service's limits too, --rls-config (the ratelimit filter) or --rlqs-config (the quota filter)"
        );
    }
    let text = std::fs::read_to_string(envoy_config)
        .with_context(|| format!("reading {}", envoy_config.display()))?;
    let config =
        NativeConfig::parse(&text).with_context(|| format!("{}", envoy_config.display()))?;
    let session = native_session(&args.run, config, envoy_config, &args.rls_config)?;
    let trace = load_trace(&args.trace, args.spread)?;
    let bar = progress_bar(trace.records.len() as u64, args.run.quiet);
    let outcome =
        sluice_sim::native::session::run(&session, &trace, &mut |n| bar.set_position(n as u64));
    bar.finish_and_clear();
    print_outcome(&outcome?, &args.run)
}

fn print_outcome(outcome: &Outcome, run: &RunArgs) -> anyhow::Result<()> {
    let report = &outcome.report;
    let rendered = report.render();
    let (head, rest) = rendered.split_once("\n\n").unwrap_or((&rendered, ""));
    println!("{head}");
    wall_line(outcome);
    println!();
    print!("{rest}");
    if let Some(path) = &run.json {
        write(path, &serde_json::to_vec_pretty(report)?)?;
    }
    if let Some(path) = &run.html {
        write(path, html::page(report).as_bytes())?;
    }
    Ok(())
}

fn compare(args: &CompareArgs) -> anyhow::Result<()> {
    if let Some(envoy_config) = &args.envoy_config {
        return compare_native(args, envoy_config);
    }
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

/// The migration preview: the YAML as written beside every algorithm.
fn compare_native(args: &CompareArgs, envoy_config: &Path) -> anyhow::Result<()> {
    let session = native_session(
        &args.run,
        read_native_config(envoy_config)?,
        envoy_config,
        &args.rls_config,
    )?;
    let trace = load_trace(&args.trace, args.spread)?;
    println!(
        "sluice-sim: {} requests from {}, through {}",
        trace.records.len(),
        trace.source,
        session.config_name
    );
    let quiet = args.run.quiet || !std::io::stderr().is_terminal();
    let comparison = sluice_sim::native::compare::run(&session, &trace, &mut |variant| {
        if !quiet {
            eprintln!("replaying with the limits {variant}");
        }
    })?;
    print!("{}", comparison.render());
    if let Some(path) = &args.run.json {
        write(path, &serde_json::to_vec_pretty(&comparison)?)?;
    }
    Ok(())
}

fn read_native_config(path: &Path) -> anyhow::Result<NativeConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    NativeConfig::parse(&text).with_context(|| format!("{}", path.display()))
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
