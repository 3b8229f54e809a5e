//! sluice-sim: replays recorded traffic through the very .wasm that runs in Envoy, via the
//! real sluice-server, into real Redis, and reports what every rule did.
//!
//! It hosts the module in the `sluice-host` crate ([`sluice_host`]: the proxy-wasm ABI host on
//! wasmtime, and one modelled Envoy around it), and keeps what a replay needs around that:
//!
//! - [`trace`]: access logs in, and synthetic traces out.
//! - [`transport`]: callouts over HTTP, with Envoy's failure encodings; [`connect`] opens the
//!   connections (TCP, or in memory to an in-process server).
//! - [`replay`]: the virtual-time event loop.
//! - [`report`]: per rule and per key, from the filter's own decision records, with accuracy
//!   ([`accuracy`]), Redis memory ([`redis_memory`]), and an HTML page with charts.
//! - [`launch`]: a server and a Redis when the user gives none.
//! - [`session`]: one replay from start to finish; [`compare`]: every algorithm side by side.
//!
//! [`Simulation`] ties them together; the `sluice-sim` binary is a thin shell over it.

#![deny(missing_docs)]

pub mod accuracy;
pub mod compare;
pub mod connect;
pub mod decided;
mod key_order;
pub mod launch;
pub mod native;
pub mod quota;
pub mod redis_memory;
pub mod replay;
pub mod report;
pub mod session;
pub mod trace;
pub mod transport;

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context;

use crate::connect::Endpoint;
use crate::replay::{Observer, Replay, RunStats};
use crate::trace::{ClientAddresses, TraceRecord};
use crate::transport::{Dispatcher, Transport};
use sluice_host::envoy::{Envoy, EnvoyConfig, FailurePolicy, StartError};
use sluice_host::{Host, Plugin};

/// The example policy kept in the repository, compiled in as the default.
pub const EXAMPLE_POLICY: &str = include_str!("../../examples/policy.json");

/// How many Envoys, with how many workers, and how they fail.
#[derive(Debug, Clone)]
pub struct Topology {
    /// Envoy instances sharing the server (and Redis).
    pub instances: usize,
    /// Workers (VMs) per instance.
    pub workers: usize,
    /// The plugin's failure policy.
    pub failure_policy: FailurePolicy,
    /// The clock: virtual (with a modelled callout latency) or paced real time.
    pub clock: replay::Clock,
}

impl Default for Topology {
    fn default() -> Topology {
        Topology {
            instances: 1,
            workers: 1,
            failure_policy: FailurePolicy::FailClosed,
            clock: replay::Clock::default(),
        }
    }
}

/// A module and a plugin configuration, ready to replay traces.
pub struct Simulation {
    host: Host,
    plugin: Plugin,
    configuration: Vec<u8>,
    cluster: String,
}

/// The result of [`Simulation::run`].
pub struct Run {
    /// Totals.
    pub stats: RunStats,
    /// The Envoys, for their stats and logs.
    pub envoys: Vec<Envoy>,
    /// Names given addresses during the run.
    pub clients: ClientAddresses,
}

impl Simulation {
    /// Loads `wasm` (refused as Envoy would refuse it) for the plugin configuration
    /// `configuration`.
    pub fn new(wasm: &[u8], configuration: &[u8]) -> anyhow::Result<Simulation> {
        let host = Host::new().map_err(|e| anyhow::anyhow!("starting wasmtime: {e}"))?;
        let plugin = host.load(wasm)?;
        let cluster = serde_json::from_slice::<serde_json::Value>(configuration)
            .ok()
            .and_then(|v| v.get("cluster")?.as_str().map(str::to_owned))
            .unwrap_or_else(|| "sluice".to_owned());
        Ok(Simulation {
            host,
            plugin,
            configuration: configuration.to_vec(),
            cluster,
        })
    }

    /// The cluster the configuration calls out to.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The wasmtime host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Starts the Envoys of `topology` at `now_ns` (the canary first, then each worker).
    pub fn envoys(&self, topology: &Topology, now_ns: u64) -> Result<Vec<Envoy>, StartError> {
        (0..topology.instances.max(1))
            .map(|i| {
                let mut config =
                    EnvoyConfig::new(self.configuration.clone(), [self.cluster.clone()]);
                config.workers = topology.workers.max(1);
                config.failure_policy = topology.failure_policy;
                config.node_id = format!("envoy-{i}");
                Envoy::start(&self.plugin, config, now_ns)
            })
            .collect()
    }

    /// Replays `records` through `topology` on its clock, calling out to `server`.
    pub fn run(
        &self,
        records: &[TraceRecord],
        topology: &Topology,
        server: Endpoint,
        runtime: &tokio::runtime::Runtime,
        observer: &mut dyn Observer,
    ) -> anyhow::Result<Run> {
        let start_ns = records
            .first()
            .map_or(0, |r| u64::try_from(r.time_us).unwrap_or(0) * 1000);
        let envoys = self
            .envoys(topology, start_ns)
            .context("starting the simulated Envoys")?;
        let clusters = HashMap::from([(self.cluster.clone(), server)]);
        let mut transport = Transport::new(clusters);
        if matches!(topology.clock, replay::Clock::Virtual { .. }) {
            transport = transport.in_virtual_time();
        }
        let dispatcher = Dispatcher::new(Arc::new(transport), runtime.handle().clone());
        let (stats, envoys, clients) = Replay::new(envoys, dispatcher, runtime, records)
            .with_clock(topology.clock)
            .run(observer);
        Ok(Run {
            stats,
            envoys,
            clients,
        })
    }
}
