//! One replay from start to finish, as the `sluice-sim` commands run it: start what is needed,
//! replay, build the report, measure Redis, stop what was started.

use anyhow::Context;
use sluice_core::policy::Policy;
use sluice_core::stat_names;

use std::collections::BTreeMap;

use crate::launch::{ServedConfigs, Services};
use crate::replay::{Clock, Observer, RunStats};
use crate::report::{self, Inputs, KnownRule, Recorder, Report, RunInfo};
use crate::trace::{Trace, TraceRecord};
use crate::{Simulation, Topology, redis_memory};
use sluice_host::envoy::{Completed, Envoy, Reloads};
use sluice_host::metric_registry::MetricValue;

/// What to replay, and against what.
pub struct Setup {
    /// The filter.
    pub wasm: Vec<u8>,
    /// Its configuration.
    pub policy: Vec<u8>,
    /// Where the configuration came from, for the report.
    pub policy_name: String,
    /// Envoys, workers, failure policy, clock.
    pub topology: Topology,
    /// A Redis to use instead of starting one.
    pub redis: Option<String>,
    /// A sluice-server (in replay mode) to use instead of starting one.
    pub server: Option<String>,
    /// How many of the most limited keys to list.
    pub top: usize,
}

/// What a session leaves.
pub struct Outcome {
    /// The report.
    pub report: Report,
    /// The decisions it was built from.
    pub recorder: Recorder,
    /// Totals, with the wall time.
    pub stats: RunStats,
}

struct Recording<'a> {
    recorder: Recorder,
    progress: &'a mut dyn FnMut(usize),
}

impl Observer for Recording<'_> {
    fn completed(&mut self, instance: usize, done: Completed, _record: &TraceRecord) {
        self.recorder.add(instance, &done);
    }

    fn callout(&mut self, latency: std::time::Duration) {
        self.recorder.callout(latency);
    }

    fn progress(&mut self, processed: usize) {
        (self.progress)(processed);
    }
}

/// Replays `trace` as `setup` says; `progress` hears how many requests have arrived.
pub fn run(
    setup: &Setup,
    trace: &Trace,
    progress: &mut dyn FnMut(usize),
) -> anyhow::Result<Outcome> {
    let simulation = Simulation::new(&setup.wasm, &setup.policy)?;
    // Every rule's limit, for the accuracy figures; the filter has already accepted it.
    let policy = Policy::from_json(&setup.policy).ok();
    let runtime = replay_runtime()?;
    let services = Services::start(
        &runtime,
        setup.redis.clone(),
        setup.server.clone(),
        ServedConfigs::default(),
    )?;
    let mut recording = Recording {
        recorder: Recorder::default(),
        progress,
    };
    let run = simulation.run(
        &trace.records,
        &setup.topology,
        services.endpoint(),
        &runtime,
        &mut recording,
    );
    let run = match run {
        Ok(run) => run,
        Err(e) => {
            services.stop(&runtime);
            return Err(e);
        }
    };
    let mut vm_failures = Vec::new();
    for (i, envoy) in run.envoys.iter().enumerate() {
        for worker in 0..envoy.workers() {
            if let Some(failure) = envoy.failed(worker) {
                vm_failures.push(format!(
                    "Envoy {i} worker {worker}: the VM failed: {failure}"
                ));
            }
        }
        // A reloaded VM is healthy at the end; the traps that made it reload are still news.
        let reloads = envoy.reloads();
        if reloads != Reloads::default() {
            vm_failures.push(format!(
                "Envoy {i}: FAIL_RELOAD started {} new VM(s) after traps ({} failed to start); {} request(s) met a failed VM within the reload backoff",
                reloads.success, reloads.failure, reloads.backoff
            ));
        }
    }
    let topology = &setup.topology;
    let stats = filter_stats(&run.envoys);
    let info = RunInfo {
        policy: setup.policy_name.clone(),
        instances: topology.instances.max(1),
        workers: topology.workers.max(1),
        clock: match topology.clock {
            Clock::Virtual { callout_latency } => report::Clock::Virtual {
                callout_latency_ms: callout_latency.as_millis() as u64,
            },
            Clock::RealTime { speed } => report::Clock::RealTime { speed },
        },
        callouts: run.stats.callouts,
        lease_calls: stats
            .get(stat_names::LEASE_CALLS)
            .and_then(|n| u64::try_from(*n).ok())
            .unwrap_or(0),
        open_at_end: run.stats.open_at_end,
        failures: vm_failures,
    };
    let report = report_and_stop(
        &recording.recorder,
        Inputs {
            trace,
            run: info,
            rules: &policy
                .as_ref()
                .map(KnownRule::of_policy)
                .unwrap_or_default(),
            top: setup.top,
            clients: &run.clients,
            stats: &stats,
        },
        services,
        &runtime,
    );
    Ok(Outcome {
        report,
        recorder: recording.recorder,
        stats: run.stats,
    })
}

/// The runtime a replay runs on. The VMs (or models), the callouts and the in-process server
/// all run on this thread, as an Envoy worker runs its filters and its network I/O on one event
/// loop: callouts progress while the replay waits, and none costs a thread switch (measured:
/// about 1.3 times the rate of a second runtime thread).
pub(crate) fn replay_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// The report of a replay `recorder` kept, with the Redis memory its limit keys take, and the
/// services it ran against stopped.
pub(crate) fn report_and_stop(
    recorder: &Recorder,
    inputs: Inputs<'_>,
    services: Services,
    runtime: &tokio::runtime::Runtime,
) -> Report {
    let mut report = Report::build(recorder, inputs);
    match services.limit_keys() {
        Some((url, prefix)) => match runtime.block_on(redis_memory::measure(url, prefix)) {
            Ok(by_rule) => report.set_memory(by_rule, prefix),
            Err(why) => report.memory_unknown(why),
        },
        None => report.memory_unknown(
            "the limit keys live in the Redis of the server given with --server".to_owned(),
        ),
    }
    services.stop(runtime);
    report
}

/// The filter's counters, summed over the Envoys, by name (without Envoy's `wasmcustom.`).
pub fn filter_stats(envoys: &[Envoy]) -> BTreeMap<String, i64> {
    let mut stats = BTreeMap::new();
    for envoy in envoys {
        for (name, _, value) in envoy.metrics().snapshot() {
            if let MetricValue::Number(n) = value {
                let name = name.strip_prefix("wasmcustom.").unwrap_or(&name).to_owned();
                *stats.entry(name).or_default() += n;
            }
        }
    }
    stats
}
