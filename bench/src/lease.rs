//! Lease mode beside per-request decisions, on a hot-key trace: four tenants at 2,400, 1,200,
//! 600 and 300 requests a second (each from 64 addresses) among ten quiet ones, each tenant
//! limited by `gcra` to 1,000 a second (burst 1,000), through 4 Envoys of 2 workers sharing
//! one Redis. The same trace, policy and topology; only the rule's `lease` differs.

use std::time::Duration;

use anyhow::Context;
use sluice_sim::Topology;
use sluice_sim::accuracy::{self, Accuracy};
use sluice_sim::report::charts;
use sluice_sim::session::{self, Outcome, Setup};
use sluice_sim::trace::synthetic::Kind;

use crate::filter::Modules;
use crate::replay::{Workload, synthetic};

/// The lease the leased run's rule takes.
pub const LEASE: &str = r#"{"horizon": "500ms"}"#;
/// Seconds of traffic.
const SECONDS: u64 = 30;
/// The key charted.
const HOTTEST: &str = "hot-0";

fn policy(lease: Option<&str>) -> String {
    let lease = lease
        .map(|l| format!(r#", "lease": {l}"#))
        .unwrap_or_default();
    format!(
        r#"{{"cluster": "sluice", "rules": [
  {{"name": "per-tenant", "key": [{{"header": "x-api-key"}}],
   "limit": {{"algorithm": "gcra", "rate": 1000, "per": "1s", "burst": 1000}}{lease}}}
]}}"#
    )
}

/// The trace.
pub fn workload() -> Workload {
    synthetic(
        Kind::HotTenants,
        1.0,
        SECONDS,
        0,
        "4 tenants at 2,400, 1,200, 600 and 300 requests/s, 10 quiet ones",
    )
}

/// One mode's figures.
pub struct LeaseRow {
    /// `per request` or `lease`.
    pub mode: &'static str,
    /// Requests replayed.
    pub requests: usize,
    /// Callouts: per-request decisions and lease calls.
    pub callouts: u64,
    /// Of which, lease calls.
    pub lease_calls: u64,
    /// The rule's decisions made inside Envoy.
    pub local: u64,
    /// The rule's accuracy.
    pub accuracy: Accuracy,
    /// Wall time of each replay, fastest first.
    pub walls: Vec<Duration>,
    /// The hottest key's admissions in the trailing second, sampled every 50 ms.
    pub trailing: Vec<(i64, u64)>,
}

impl LeaseRow {
    /// Callouts per 1,000 requests.
    pub fn per_thousand(&self) -> f64 {
        self.callouts as f64 * 1000.0 / self.requests.max(1) as f64
    }

    /// Requests per second of the median replay, and of the slowest and fastest.
    pub fn rates(&self) -> (f64, f64, f64) {
        let rate = |w: Duration| self.requests as f64 / w.as_secs_f64().max(1e-9);
        (
            rate(self.walls[self.walls.len() / 2]),
            rate(*self.walls.last().unwrap_or(&Duration::ZERO)),
            rate(*self.walls.first().unwrap_or(&Duration::ZERO)),
        )
    }
}

fn replay(modules: &Modules, lease: Option<&str>, workload: &Workload) -> anyhow::Result<Outcome> {
    let setup = Setup {
        wasm: std::fs::read(&modules.sluice).context("reading the filter (run `make wasm`)")?,
        policy: policy(lease).into_bytes(),
        policy_name: "bench".to_owned(),
        topology: Topology {
            instances: 4,
            workers: 2,
            ..Topology::default()
        },
        redis: None,
        server: None,
        top: 10,
    };
    session::run(&setup, &workload.trace, &mut |_| {})
}

/// Replays the trace `runs` times in each mode; the figures come from the last replay (virtual
/// time: every replay decides alike), the rates from all.
pub fn run(modules: &Modules, workload: &Workload, runs: usize) -> anyhow::Result<Vec<LeaseRow>> {
    [("per request", None), ("lease", Some(LEASE))]
        .into_iter()
        .map(|(mode, lease)| {
            let mut walls = Vec::new();
            let mut last = None;
            for _ in 0..runs {
                eprintln!("bench: lease mode: replaying {mode} ...");
                let outcome = replay(modules, lease, workload)?;
                walls.push(outcome.stats.wall);
                last = Some(outcome);
            }
            walls.sort();
            let outcome = last.context("no replay")?;
            let rule = outcome
                .report
                .rules
                .first()
                .context("the report has no rule")?;
            let accuracy = rule.accuracy.clone().context("no accuracy")?;
            let admitted = outcome.recorder.admitted_times("per-tenant", HOTTEST);
            let steps = accuracy::trailing_counts(&admitted, 1_000_000, 1);
            let trailing = sample(&steps, 50_000);
            Ok(LeaseRow {
                mode,
                requests: outcome.stats.requests,
                callouts: outcome.stats.callouts,
                lease_calls: outcome.report.run.lease_calls,
                local: rule.counts.local,
                accuracy,
                walls,
                trailing,
            })
        })
        .collect()
}

/// A step function `(time, value)` read every `every_us`.
fn sample(steps: &[(i64, u64)], every_us: i64) -> Vec<(i64, u64)> {
    let (Some(first), Some(last)) = (steps.first(), steps.last()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut at = 0;
    let mut t = first.0;
    while t <= last.0 {
        while at + 1 < steps.len() && steps[at + 1].0 <= t {
            at += 1;
        }
        out.push((t, steps[at].1));
        t += every_us;
    }
    out
}

/// The hottest key's trailing-second admissions in both modes, against its limit, as SVG.
pub fn chart(rows: &[LeaseRow]) -> String {
    let series: Vec<(String, Vec<(i64, u64)>)> = rows
        .iter()
        .map(|r| (r.mode.to_owned(), r.trailing.clone()))
        .collect();
    let from = series
        .iter()
        .filter_map(|(_, s)| s.first().map(|p| p.0))
        .min()
        .unwrap_or(0);
    let to = series
        .iter()
        .filter_map(|(_, s)| s.last().map(|p| p.0))
        .max()
        .unwrap_or(from + 1);
    charts::step_lines(
        &format!("tenant {HOTTEST} (2,400 requests/s): admitted in the trailing second"),
        "admitted in the trailing second",
        &series,
        Some(("the limit, 1,000 a second", 1000)),
        from,
        to,
    )
}
