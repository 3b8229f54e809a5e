//! The simulator end to end: replay rate in virtual time through the filter, the server and
//! Redis, beside the same replay through the no-op filter (the host and the replay loop
//! alone); and the deny cache on an attack trace, on and off.
//!
//! Replays run as `sluice-sim replay` runs them ([`sluice_sim::session`]): a redis-server
//! started for the run, the server in this process, one Envoy with one worker, each callout
//! answered 1 ms (virtual) after it left.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use redis::aio::MultiplexedConnection;
use sluice_harness::RedisServer;
use sluice_sim::native::session::NativeSession;
use sluice_sim::native::{self, NativeConfig};
use sluice_sim::quota::session::QuotaSession;
use sluice_sim::quota::{self, QuotaConfig};
use sluice_sim::report::Report;
use sluice_sim::session::{self, Outcome, Setup};
use sluice_sim::trace::synthetic::{self, GenOptions, Kind};
use sluice_sim::trace::{self, ReadOptions, Trace};
use sluice_sim::{EXAMPLE_POLICY, Topology};

use crate::filter::Modules;

/// A trace to replay, and how it was made.
pub struct Workload {
    /// What it is, for the table.
    pub name: String,
    /// The trace.
    pub trace: Trace,
}

/// The zanbil access log from the shared traces, if this checkout has them.
pub fn zanbil() -> Result<Workload, String> {
    let path = Path::new("../shared/traces/zanbil_access_10k.log");
    if !path.exists() {
        return Err(format!(
            "{} is absent (a user's clone has no ../shared)",
            path.display()
        ));
    }
    let trace = trace::read_file(path, ReadOptions::default()).map_err(|e| e.to_string())?;
    Ok(Workload {
        name: "zanbil_access_10k.log (nginx combined log, 1 s timestamps)".to_owned(),
        trace,
    })
}

/// A synthetic trace of `seconds` of traffic, cut at `requests` requests (0: not cut).
pub fn synthetic(
    kind: Kind,
    rate_scale: f64,
    seconds: u64,
    requests: usize,
    what: &str,
) -> Workload {
    let records = synthetic::generate(GenOptions {
        kind,
        seconds,
        seed: 1,
        max_requests: requests,
        rate_scale,
    });
    let name = format!(
        "synthetic `{}` x{rate_scale}, {} requests ({what})",
        format!("{kind:?}").to_lowercase(),
        records.len()
    );
    Workload {
        name,
        trace: Trace {
            source: "sluice-bench".to_owned(),
            records,
            ..Trace::default()
        },
    }
}

fn setup(wasm: &Path, policy: &str, redis: Option<String>) -> anyhow::Result<Setup> {
    Ok(Setup {
        wasm: std::fs::read(wasm)
            .with_context(|| format!("reading {} (run `make wasm`)", wasm.display()))?,
        policy: policy.as_bytes().to_vec(),
        policy_name: "bench".to_owned(),
        topology: Topology::default(),
        redis,
        server: None,
        top: 10,
    })
}

fn replay(setup: &Setup, trace: &Trace) -> anyhow::Result<Outcome> {
    session::run(setup, trace, &mut |_| {})
}

/// One replay-rate row.
pub struct RateRow {
    /// The workload.
    pub name: String,
    /// Requests replayed.
    pub requests: usize,
    /// Callouts sluice's filter made.
    pub callouts: u64,
    /// Requests denied (429).
    pub denied: u64,
    /// Wall time of each of sluice's replays, fastest first.
    pub walls: Vec<Duration>,
    /// Wall time of the no-op filter's replay of the same trace.
    pub noop_wall: Duration,
}

impl RateRow {
    fn rate_of(&self, wall: Duration) -> f64 {
        self.requests as f64 / wall.as_secs_f64().max(1e-9)
    }

    /// The median replay's wall time.
    pub fn median_wall(&self) -> Duration {
        self.walls[self.walls.len() / 2]
    }

    /// sluice's requests per second, in the median replay.
    pub fn rate(&self) -> f64 {
        self.rate_of(self.median_wall())
    }

    /// sluice's requests per second, in the slowest and the fastest replay.
    pub fn rate_range(&self) -> (f64, f64) {
        let slowest = self.walls.last().copied().unwrap_or_default();
        let fastest = self.walls.first().copied().unwrap_or_default();
        (self.rate_of(slowest), self.rate_of(fastest))
    }

    /// The no-op filter's requests per second.
    pub fn noop_rate(&self) -> f64 {
        self.requests as f64 / self.noop_wall.as_secs_f64().max(1e-9)
    }
}

/// Replays `workload` with the example policy `runs` times (each against a fresh Redis: the
/// rate on a shared machine varies from run to run, and the median says more than any one),
/// then once with the no-op filter.
pub fn rate(modules: &Modules, workload: &Workload, runs: usize) -> anyhow::Result<RateRow> {
    let setup_sluice = setup(&modules.sluice, EXAMPLE_POLICY, None)?;
    let mut sluice = replay(&setup_sluice, &workload.trace)?;
    let mut walls = vec![sluice.stats.wall];
    for _ in 1..runs {
        let again = replay(&setup_sluice, &workload.trace)?;
        anyhow::ensure!(
            again.stats.callouts == sluice.stats.callouts,
            "two replays of one trace made {} and {} callouts",
            sluice.stats.callouts,
            again.stats.callouts
        );
        walls.push(again.stats.wall);
        sluice = again;
    }
    walls.sort();
    let noop = replay(&setup(&modules.noop, "{}", None)?, &workload.trace)?;
    Ok(RateRow {
        name: workload.name.clone(),
        requests: sluice.stats.requests,
        callouts: sluice.stats.callouts,
        denied: sluice.report.responses.get(&429).copied().unwrap_or(0),
        walls,
        noop_wall: noop.stats.wall,
    })
}

/// The native filter's replay rate of one trace.
pub struct NativeRateRow {
    /// `ShouldRateLimit` calls made.
    pub calls: u64,
    /// Requests denied (429).
    pub denied: u64,
    /// Requests per second of each replay, slowest first.
    pub rates: Vec<f64>,
}

impl NativeRateRow {
    /// The median replay's requests per second.
    pub fn median(&self) -> f64 {
        self.rates[self.rates.len() / 2]
    }
}

/// Replays `workload` `runs` times through the model of Envoy's native rate limit filter, with
/// the shipped `envoy/envoy-ratelimit.yaml` and `envoy/ratelimit/` (each against a fresh
/// Redis).
pub fn native_rate(workload: &Workload, runs: usize) -> anyhow::Result<NativeRateRow> {
    let config_path = Path::new("envoy/envoy-ratelimit.yaml");
    let text = std::fs::read_to_string(config_path)
        .with_context(|| format!("reading {}", config_path.display()))?;
    let session = NativeSession {
        config: NativeConfig::parse(&text)?,
        config_name: config_path.display().to_string(),
        rls_config: vec!["envoy/ratelimit".into()],
        instances: 1,
        callout_latency: Duration::from_millis(1),
        redis: None,
        top: 10,
    };
    let mut rates = Vec::with_capacity(runs);
    let mut last = None;
    for _ in 0..runs {
        let outcome = native::session::run(&session, &workload.trace, &mut |_| {})?;
        rates.push(outcome.stats.requests as f64 / outcome.stats.wall.as_secs_f64().max(1e-9));
        last = Some(outcome);
    }
    rates.sort_by(f64::total_cmp);
    let outcome = last.context("no replay ran")?;
    Ok(NativeRateRow {
        calls: outcome.stats.callouts,
        denied: outcome.report.responses.get(&429).copied().unwrap_or(0),
        rates,
    })
}

/// Replays `workload` `runs` times through the model of Envoy's quota filter, with the shipped
/// `envoy/envoy-rlqs.yaml` and `envoy/rlqs/`, one Envoy (each run against a fresh Redis);
/// requests a second of each, slowest first, and the requests denied.
pub fn quota_rate(workload: &Workload, runs: usize) -> anyhow::Result<(Vec<f64>, u64)> {
    let config_path = Path::new("envoy/envoy-rlqs.yaml");
    let text = std::fs::read_to_string(config_path)
        .with_context(|| format!("reading {}", config_path.display()))?;
    let session = QuotaSession {
        config: QuotaConfig::parse(&text)?,
        config_name: config_path.display().to_string(),
        rlqs_config: vec!["envoy/rlqs".into()],
        instances: 1,
        latency: Duration::from_millis(1),
        redis: None,
        top: 10,
    };
    let mut rates = Vec::with_capacity(runs);
    let mut denied = 0;
    for _ in 0..runs {
        let outcome = quota::session::run(&session, &workload.trace, &mut |_| {})?;
        rates.push(outcome.stats.requests as f64 / outcome.stats.wall.as_secs_f64().max(1e-9));
        denied = outcome.report.responses.get(&429).copied().unwrap_or(0);
    }
    rates.sort_by(f64::total_cmp);
    Ok((rates, denied))
}

/// The attack trace's abuser (see [`Kind::Attack`]).
const ATTACKER: &str = "203.0.113.66";

/// One client address, one per-second limit; the deny cache on or off.
fn attack_policy(deny_cache: bool) -> String {
    format!(
        r#"{{
  "cluster": "sluice",
  "deny_cache": {deny_cache},
  "rules": [
    {{"name": "per-client", "key": ["client_ip"],
     "limit": {{"algorithm": "gcra", "rate": 1, "per": "1s", "burst": 10}}}}
  ]
}}"#
    )
}

/// What one attack replay did.
pub struct AttackRow {
    /// Whether the deny cache was on.
    pub deny_cache: bool,
    /// Requests in the trace.
    pub requests: usize,
    /// Callouts made.
    pub callouts: u64,
    /// Script calls Redis ran (`FCALL`, or `EVALSHA` where the server fell back to it).
    pub script_calls: u64,
    /// Every command Redis ran (the script calls, the commands inside them, the library's load).
    pub redis_commands: u64,
    /// Requests admitted, all clients.
    pub admitted: u64,
    /// Requests admitted from the abuser.
    pub attacker_admitted: u64,
    /// Requests from the abuser.
    pub attacker_offered: u64,
    /// Wall time.
    pub wall: Duration,
}

async fn reset_stats(c: &mut MultiplexedConnection) -> anyhow::Result<()> {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(c)
        .await?;
    Ok(())
}

/// (script calls, every command but INFO and CONFIG) since the last reset.
async fn commands(c: &mut MultiplexedConnection) -> anyhow::Result<(u64, u64)> {
    let calls = crate::memory::command_calls(c).await?;
    let script_calls = ["fcall", "evalsha"]
        .iter()
        .filter_map(|name| calls.get(*name))
        .sum();
    let total = calls
        .iter()
        .filter(|(name, _)| !name.starts_with("info") && !name.starts_with("config"))
        .map(|(_, n)| n)
        .sum();
    Ok((script_calls, total))
}

fn attacker_counts(report: &Report) -> (u64, u64) {
    report
        .top_limited
        .iter()
        .find(|k| k.client.as_deref() == Some(ATTACKER) || k.key == ATTACKER)
        .map_or((0, 0), |k| (k.counts.allowed, k.counts.offered))
}

/// The attack trace: 200 clients at one request a second, one at a hundred, limited to one a
/// second each (burst 10).
pub fn attack_trace() -> Workload {
    synthetic(
        Kind::Attack,
        2.0,
        600,
        0,
        "one client at 100 times the limit",
    )
}

/// Replays the attack trace with the deny cache on, then off.
pub fn deny_cache(modules: &Modules, workload: &Workload) -> anyhow::Result<Vec<AttackRow>> {
    let redis = RedisServer::start().context("starting redis-server")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = redis::Client::open(redis.url())?;
    let mut c = runtime.block_on(client.get_multiplexed_async_connection())?;
    [true, false]
        .into_iter()
        .map(|on| {
            runtime.block_on(reset_stats(&mut c))?;
            let outcome = replay(
                &setup(
                    &modules.sluice,
                    &attack_policy(on),
                    Some(redis.unix_url().unwrap_or_else(|| redis.url())),
                )?,
                &workload.trace,
            )?;
            let (script_calls, redis_commands) = runtime.block_on(commands(&mut c))?;
            let (attacker_admitted, attacker_offered) = attacker_counts(&outcome.report);
            Ok(AttackRow {
                deny_cache: on,
                requests: outcome.stats.requests,
                callouts: outcome.stats.callouts,
                script_calls,
                redis_commands,
                admitted: outcome.report.responses.get(&200).copied().unwrap_or(0),
                attacker_admitted,
                attacker_offered,
                wall: outcome.stats.wall,
            })
        })
        .collect()
}
