//! One replay through the native rate limit filter from start to finish: a server serving the
//! user's rate limit configuration, the replay, the report, Redis measured.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use sluice_core::stat_names::{RuleStat, rule_stat};
use sluice_server::rls::config::WatchedConfig;

use super::NativeConfig;
use super::replay::{self, NativeSetup};
use crate::launch::{ServedConfigs, Services};
use crate::replay::RunStats;
use crate::report::{Inputs, KnownRule, Recorder, RunInfo};
use crate::session::{Outcome, replay_runtime, report_and_stop};
use crate::trace::Trace;

/// What to replay through the native filter, and against what.
pub struct NativeSession {
    /// The Envoy configuration.
    pub config: NativeConfig,
    /// Where it came from, for the report.
    pub config_name: String,
    /// The rate limit service's configuration files (a directory or files).
    pub rls_config: Vec<PathBuf>,
    /// Envoys taking the trace round robin.
    pub instances: usize,
    /// The modelled time from a call to its answer.
    pub callout_latency: Duration,
    /// A Redis to use instead of starting one.
    pub redis: Option<String>,
    /// How many of the most limited keys to list.
    pub top: usize,
}

/// Replays `trace` as `session` says; `progress` hears how many requests are decided.
pub fn run(
    session: &NativeSession,
    trace: &Trace,
    progress: &mut dyn FnMut(usize),
) -> anyhow::Result<Outcome> {
    let watched = WatchedConfig::load(session.rls_config.clone())
        .map_err(|e| anyhow::anyhow!("--rls-config: {e}"))?;
    let limits = watched.current();
    for filter in &session.config.filters {
        if !limits.domains().any(|d| d == filter.domain) {
            anyhow::bail!(
                "{}: the filter's domain `{}` is in none of the --rls-config files (they configure {})",
                filter.path,
                filter.domain,
                limits.domains().collect::<Vec<_>>().join(", ")
            );
        }
    }
    let runtime = replay_runtime()?;
    // The server runs here: its gRPC API is reached without a socket.
    let served = ServedConfigs {
        rls: Some(watched),
        rlqs: None,
    };
    let services = Services::start(&runtime, session.redis.clone(), None, served)?;
    let setup = NativeSetup {
        config: &session.config,
        limits: &limits,
        instances: session.instances,
        callout_latency: session.callout_latency,
    };
    let mut recorder = Recorder::default();
    // Per rule, the calls that carried it, as the .wasm's `callouts` counter counts them.
    let mut carried: BTreeMap<String, i64> = BTreeMap::new();
    let (stats, clients) = replay::replay(
        &setup,
        &trace.records,
        &services.endpoint(),
        &runtime,
        &mut |decision| {
            for line in &decision.lines {
                *carried
                    .entry(rule_stat(line.rule.as_str(), RuleStat::Callouts))
                    .or_default() += 1;
            }
            recorder.add_decided(
                decision.instance,
                decision.status,
                decision.time_us,
                &decision.lines,
            );
        },
        progress,
    );
    let mut failures = Vec::new();
    if let Some(first) = &stats.first_failure {
        failures.push(format!(
            "{} of {} ShouldRateLimit calls failed (the filters' failure mode decided them); the first: {first}",
            stats.failed_calls, stats.calls
        ));
    }
    let info = RunInfo::of_native_model(
        session.config_name.clone(),
        session.instances,
        session.callout_latency,
        stats.calls,
        failures,
    );
    let rules = KnownRule::of_rls(&limits);
    let report = report_and_stop(
        &recorder,
        Inputs {
            trace,
            run: info,
            rules: &rules,
            top: session.top,
            clients: &clients,
            stats: &carried,
        },
        services,
        &runtime,
    );
    Ok(Outcome {
        report,
        recorder,
        stats: RunStats {
            requests: stats.requests,
            callouts: stats.calls,
            open_at_end: 0,
            wall: stats.wall,
        },
    })
}
