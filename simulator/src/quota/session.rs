//! One replay through the quota filter's model from start to finish: a server serving the
//! user's quota configuration, N Envoys' streams, the report, Redis measured.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use sluice_server::rlqs::config::WatchedConfig;

use super::QuotaConfig;
use super::replay::{self, QuotaSetup};
use crate::connect::Endpoint;
use crate::launch::{ServedConfigs, Services};
use crate::replay::RunStats;
use crate::report::{Inputs, KnownRule, Recorder, RunInfo};
use crate::session::{Outcome, replay_runtime, report_and_stop};
use crate::trace::Trace;

/// What to replay through the quota filter, and against what.
pub struct QuotaSession {
    /// The filter's configuration.
    pub config: QuotaConfig,
    /// Where it came from, for the report.
    pub config_name: String,
    /// The quota service's configuration files (a directory or files).
    pub rlqs_config: Vec<PathBuf>,
    /// Envoys taking the trace round robin, each with its own stream.
    pub instances: usize,
    /// The modelled time a message takes, either way.
    pub latency: Duration,
    /// A Redis to use instead of starting one.
    pub redis: Option<String>,
    /// How many of the most limited buckets to list.
    pub top: usize,
}

/// Replays `trace` as `session` says; `progress` hears how many requests are decided.
pub fn run(
    session: &QuotaSession,
    trace: &Trace,
    progress: &mut dyn FnMut(usize),
) -> anyhow::Result<Outcome> {
    let watched = WatchedConfig::load(session.rlqs_config.clone())
        .map_err(|e| anyhow::anyhow!("--rlqs-config: {e}"))?;
    let limits = watched.current();
    if limits.domain(&session.config.domain).is_none() {
        anyhow::bail!(
            "the quota filter's domain `{}` is in none of the --rlqs-config files",
            session.config.domain
        );
    }
    let runtime = replay_runtime()?;
    let served = ServedConfigs {
        rls: None,
        rlqs: Some(watched),
    };
    let services = Services::start(&runtime, session.redis.clone(), None, served)?;
    let Endpoint::InProcess(server) = services.endpoint() else {
        anyhow::bail!("the quota replay needs the server in this process");
    };
    let setup = QuotaSetup {
        config: &session.config,
        limits: &limits,
        instances: session.instances,
        latency: session.latency,
        instance_of: None,
    };
    let mut recorder = Recorder::default();
    let (stats, clients) = replay::replay(
        &setup,
        &trace.records,
        &server,
        &runtime,
        &mut |d| recorder.add_decided(d.instance, d.status, d.time_us, &d.lines),
        progress,
    );
    let failures = stats
        .refused
        .first()
        .map(|first| {
            format!(
                "{} quota reports refused (each ends its stream; the Envoy opens another at its next report); the first: {first}",
                stats.refused.len()
            )
        })
        .into_iter()
        .collect();
    let info = RunInfo::of_native_model(
        session.config_name.clone(),
        session.instances,
        session.latency,
        stats.reports,
        failures,
    );
    let rules = KnownRule::of_rlqs(&limits);
    drop(server);
    let report = report_and_stop(
        &recorder,
        Inputs {
            trace,
            run: info,
            rules: &rules,
            top: session.top,
            clients: &clients,
            stats: &BTreeMap::new(),
        },
        services,
        &runtime,
    );
    Ok(Outcome {
        report,
        recorder,
        stats: RunStats {
            requests: stats.requests,
            callouts: stats.reports,
            open_at_end: 0,
            wall: stats.wall,
        },
    })
}
