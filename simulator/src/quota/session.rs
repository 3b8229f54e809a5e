//! One replay through the quota filter's model from start to finish: a server serving the
//! user's quota configuration, N Envoys' streams, the report, Redis measured.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use sluice_core::rlqs::{Quota, RlqsConfig};

use super::QuotaConfig;
use super::replay::{self, QuotaSetup};
use crate::accuracy::RuleLimit;
use crate::connect::Endpoint;
use crate::launch::{ServiceFiles, Services};
use crate::replay::RunStats;
use crate::report::{self, Inputs, KnownRule, Recorder, RunInfo};
use crate::session::{Outcome, report_and_stop};
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

/// Each limited rule of the quota configuration, for accuracy.
fn known_rules(config: &RlqsConfig) -> Vec<KnownRule> {
    config
        .domains()
        .flat_map(|(_, domain)| domain.rules.iter().chain(std::iter::once(&domain.default)))
        .map(|rule| KnownRule {
            name: rule.name.to_string(),
            limit: match rule.quota {
                Quota::Limit(limit) => Some(RuleLimit {
                    limit,
                    cost: 1,
                    count_denied: false,
                    lease_allowance: 0,
                }),
                Quota::AllowAll | Quota::DenyAll => None,
            },
            shadow: false,
            lease: None,
        })
        .collect()
}

/// Replays `trace` as `session` says; `progress` hears how many requests are decided.
pub fn run(
    session: &QuotaSession,
    trace: &Trace,
    progress: &mut dyn FnMut(usize),
) -> anyhow::Result<Outcome> {
    let limits: RlqsConfig = sluice_server::config_files::load(&session.rlqs_config)
        .map_err(|e| anyhow::anyhow!("--rlqs-config: {e}"))?;
    if limits.domain(&session.config.domain).is_none() {
        anyhow::bail!(
            "the quota filter's domain `{}` is in none of the --rlqs-config files",
            session.config.domain
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let files = ServiceFiles {
        rlqs: session.rlqs_config.clone(),
        ..ServiceFiles::default()
    };
    let services = Services::start(&runtime, session.redis.clone(), None, &files)?;
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
    let info = RunInfo {
        policy: session.config_name.clone(),
        instances: session.instances.max(1),
        workers: 1,
        clock: report::Clock::Virtual {
            callout_latency_ms: session.latency.as_millis() as u64,
        },
        callouts: stats.reports,
        lease_calls: 0,
        open_at_end: 0,
        failures,
    };
    let rules = known_rules(&limits);
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
