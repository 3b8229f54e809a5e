//! The command line: what each subcommand takes, and what a replay is set up from.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;
use clap::{Args, Parser, Subcommand};
use sluice_core::duration::Millis;
use sluice_host::envoy::FailurePolicy;
use sluice_sim::Topology;
use sluice_sim::compare::Nominal;
use sluice_sim::native::NativeConfig;
use sluice_sim::native::session::NativeSession;
use sluice_sim::quota::QuotaConfig;
use sluice_sim::quota::session::QuotaSession;
use sluice_sim::replay::Clock;
use sluice_sim::session::Setup;
use sluice_sim::trace::synthetic::{self, GenOptions, Kind};
use sluice_sim::trace::timing::Spread;
use sluice_sim::trace::{self, Format, ReadOptions, Trace};

#[derive(Parser)]
#[command(
    name = "sluice-sim",
    version,
    about = "Replays traffic through the sluice filter as Envoy hosts it, via sluice-server, into Redis."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
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
pub struct TraceArgs {
    /// The trace (default: a synthetic demo trace, 10 minutes of visitors and crawlers).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// The trace's format.
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    pub format: Format,
    /// Sort a trace whose lines are out of time order (instead of refusing it).
    #[arg(long)]
    pub sort: bool,
    /// Skip lines that cannot be read (counted), instead of stopping at the first.
    #[arg(long)]
    pub skip_bad: bool,
}

#[derive(Args)]
pub struct RunArgs {
    /// The filter (.wasm).
    #[arg(long, env = "SLUICE_WASM")]
    pub wasm: Option<PathBuf>,
    /// A Redis to use (default: start a redis-server on a free port).
    #[arg(long)]
    pub redis: Option<String>,
    /// A sluice-server in replay mode to use (default: start one in this process).
    #[arg(long)]
    pub server: Option<String>,
    /// Envoy instances sharing the server and Redis (requests go round robin).
    #[arg(long, default_value_t = 1)]
    pub instances: usize,
    /// Worker threads (VMs) per Envoy.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Skip the filter when its VM fails, instead of answering 503.
    #[arg(long, conflicts_with = "fail_reload")]
    pub fail_open: bool,
    /// When a worker's VM fails, answer 503 and give the worker a new VM on the first request
    /// at least this long after the last load (Envoy's FAIL_RELOAD and its backoff's
    /// base_interval, e.g. 1s).
    #[arg(long)]
    pub fail_reload: Option<Millis>,
    /// In virtual time: the modelled time from a callout to its answer.
    #[arg(long, default_value = "1ms")]
    pub callout_latency: Millis,
    /// Replay in real time, paced at this many trace seconds per second (e.g. 1, or 60),
    /// instead of in virtual time; the report then gives measured callout latencies.
    #[arg(long)]
    pub speed: Option<f64>,
    /// Write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the report as an HTML page with charts here.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// How many of the most limited keys to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Args)]
pub struct ReplayArgs {
    /// The filter's configuration (default: examples/policy.json, compiled in).
    #[arg(long, conflicts_with = "envoy_config")]
    pub policy: Option<PathBuf>,
    /// Replay through Envoy's native filters instead of the .wasm: the Envoy configuration
    /// (bootstrap YAML). With --rls-config, its `ratelimit` filter and routes' `rate_limits`;
    /// with --rlqs-config, its `rate_limit_quota` filter.
    #[arg(long)]
    pub envoy_config: Option<PathBuf>,
    /// With --envoy-config: the rate limit service's configuration (envoyproxy/ratelimit's
    /// YAML), a directory or files, as sluice-server's --rls-config takes it.
    #[arg(long, requires = "envoy_config", conflicts_with = "rlqs_config", num_args = 1..)]
    pub rls_config: Vec<PathBuf>,
    /// With --envoy-config: the quota service's configuration, as sluice-server's
    /// --rlqs-config takes it.
    #[arg(long, requires = "envoy_config", num_args = 1..)]
    pub rlqs_config: Vec<PathBuf>,
    #[command(flatten)]
    pub trace: TraceArgs,
    /// Spread the requests of each timestamp step over the step (auto: when the timestamps
    /// are only real to the minute or the hour).
    #[arg(long, value_enum, default_value_t = Spread::Auto)]
    pub spread: Spread,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Args)]
pub struct CompareArgs {
    /// The migration preview: the descriptors this Envoy configuration's routes make, decided
    /// by the --rls-config YAML as written and by each algorithm at each limit's rate.
    #[arg(long, requires = "rls_config", conflicts_with_all = ["rate", "key", "lease_horizon", "no_lease"])]
    pub envoy_config: Option<PathBuf>,
    /// With --envoy-config: the rate limit service's configuration (envoyproxy/ratelimit's
    /// YAML), a directory or files.
    #[arg(long, requires = "envoy_config", num_args = 1..)]
    pub rls_config: Vec<PathBuf>,
    /// The nominal rate, as units/period: 10/1s, 600/1m.
    #[arg(long, default_value = "10/1s")]
    pub rate: Nominal,
    /// What one limit counts, as the policy's key parts in JSON.
    #[arg(long, default_value = r#"["client_ip"]"#)]
    pub key: String,
    /// The lease horizon of each algorithm's leased twin (the lease columns).
    #[arg(long, default_value = "200ms")]
    pub lease_horizon: Millis,
    /// Leave out the leased twins.
    #[arg(long)]
    pub no_lease: bool,
    #[command(flatten)]
    pub trace: TraceArgs,
    /// Spread the requests of each timestamp step over the step. By default they are spread
    /// evenly: logs record seconds, and a fixed window's boundary burst lives inside them.
    #[arg(long, value_enum, default_value_t = Spread::Even)]
    pub spread: Spread,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Args)]
pub struct GenArgs {
    /// The kind of traffic.
    #[arg(long, value_enum, default_value_t = Kind::Demo)]
    pub kind: Kind,
    /// How long the trace lasts (e.g. 10m).
    #[arg(long, default_value = "10m")]
    pub duration: Millis,
    /// The seed: the same seed gives the same trace.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop after this many requests (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub requests: usize,
    /// Multiply every client's rate.
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Where to write the trace (JSON lines); `-` for standard output.
    #[arg(long, default_value = "-")]
    pub out: PathBuf,
}

#[derive(Args)]
pub struct CheckArgs {
    /// The configuration to check.
    #[arg(long)]
    pub policy: PathBuf,
    /// The filter (.wasm).
    #[arg(long, env = "SLUICE_WASM")]
    pub wasm: Option<PathBuf>,
}

/// Where the filter is: `--wasm`, else the workspace's build output next to this binary or
/// under the current directory.
pub fn find_wasm(given: Option<&Path>) -> anyhow::Result<Vec<u8>> {
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

pub fn load_trace(args: &TraceArgs, spread: Spread) -> anyhow::Result<Trace> {
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

pub fn setup(run: &RunArgs, policy: Vec<u8>, policy_name: String) -> anyhow::Result<Setup> {
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

/// A replay through the native rate limit filter, from the run's flags.
pub fn native_session(
    run: &RunArgs,
    config: NativeConfig,
    config_path: &Path,
    rls_config: &[PathBuf],
) -> anyhow::Result<NativeSession> {
    if run.speed.is_some() || run.server.is_some() {
        bail!(
            "--speed, --server: a replay through --envoy-config runs in virtual time, against a server in this process"
        );
    }
    if run.workers > 1 || run.fail_open || run.fail_reload.is_some() || run.wasm.is_some() {
        bail!(
            "--workers, --fail-open, --fail-reload and --wasm are about the .wasm's VMs; the native filter has none (its failure mode is the configuration's failure_mode_deny)"
        );
    }
    Ok(NativeSession {
        config,
        config_name: format!(
            "{} with {}",
            config_path.display(),
            rls_config
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        rls_config: rls_config.to_vec(),
        instances: run.instances.max(1),
        callout_latency: Duration::from_millis(run.callout_latency.as_millis()),
        redis: run.redis.clone(),
        top: run.top,
    })
}

/// A replay through the quota filter, from the run's flags.
pub fn quota_session(
    run: &RunArgs,
    config: QuotaConfig,
    config_path: &Path,
    rlqs_config: &[PathBuf],
) -> anyhow::Result<QuotaSession> {
    if run.speed.is_some() || run.server.is_some() {
        bail!(
            "--speed, --server: a replay through the quota filter runs in virtual time, against a server in this process"
        );
    }
    if run.workers > 1 || run.fail_open || run.fail_reload.is_some() || run.wasm.is_some() {
        bail!(
            "--workers, --fail-open, --fail-reload and --wasm are about the .wasm's VMs; the quota filter has none (its workers share one bucket cache)"
        );
    }
    Ok(QuotaSession {
        config,
        config_name: format!(
            "{} with {}",
            config_path.display(),
            rlqs_config
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        rlqs_config: rlqs_config.to_vec(),
        instances: run.instances.max(1),
        latency: Duration::from_millis(run.callout_latency.as_millis()),
        redis: run.redis.clone(),
        top: run.top,
    })
}
