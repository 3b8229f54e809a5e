//! The probe filter (`tests/probe`) in one simulated Envoy, and what it logged.
//!
//! The probe runs the steps its script gives in each callback and logs every callback and every
//! host call's answer as a JSON line; [`Probe::events`] reads them back.

use std::net::IpAddr;

use serde_json::Value;
use sluice_host::Host;
use sluice_host::envoy::{
    Completed, Envoy, EnvoyConfig, FailurePolicy, Output, Request, StartError,
};
use sluice_host::state::{CalloutReply, OutgoingCallout};

/// The probe built by `make wasm` (or `SLUICE_PROBE_WASM`).
pub fn probe_wasm() -> Vec<u8> {
    crate::built_wasm("sluice_probe", "SLUICE_PROBE_WASM")
}

/// Where [`probe_wasm`] reads the probe from, for a real Envoy to load.
pub fn probe_wasm_path() -> std::path::PathBuf {
    crate::built_wasm_path("sluice_probe", "SLUICE_PROBE_WASM")
}

/// The worker label of the canary VM's log lines.
pub const CANARY: usize = usize::MAX;

/// One line the probe logged.
#[derive(Debug, Clone)]
pub struct Event {
    /// The VM's worker ([`CANARY`] for the canary).
    pub worker: usize,
    /// The line.
    pub fields: Value,
}

impl Event {
    /// `enter`, `op`, `leave`, `initialize` or `script`.
    pub fn kind(&self) -> &str {
        self.fields["event"].as_str().unwrap_or_default()
    }

    /// The callback it was logged in.
    pub fn cb(&self) -> &str {
        self.fields["cb"].as_str().unwrap_or_default()
    }

    /// The context the callback was called for.
    pub fn ctx(&self) -> u64 {
        self.fields["ctx"].as_u64().unwrap_or(u64::MAX)
    }

    /// For an `op` event, which operation.
    pub fn op(&self) -> &str {
        self.fields["op"].as_str().unwrap_or_default()
    }

    /// The host call's status (0 Ok, 1 NotFound, 2 BadArgument, ...).
    pub fn status(&self) -> u64 {
        self.fields["status"].as_u64().unwrap_or(u64::MAX)
    }

    /// An answer's value as text.
    pub fn text(&self) -> &str {
        self.fields["value"]["text"].as_str().unwrap_or_default()
    }

    /// An answer's value as raw bytes.
    pub fn raw(&self) -> Vec<u8> {
        self.fields["value"]["raw"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|b| b.as_u64())
                    .map(|b| b as u8)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The callback's numeric arguments (for `enter` events).
    pub fn args(&self) -> Vec<u64> {
        self.fields["args"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default()
    }

    /// Header pairs an answer carried.
    pub fn pairs(&self) -> Vec<(String, String)> {
        serde_json::from_value(self.fields["pairs"].clone()).unwrap_or_default()
    }
}

/// One Envoy hosting the probe.
pub struct Probe {
    /// The Envoy.
    pub envoy: Envoy,
    /// Virtual time, ns.
    pub now_ns: u64,
    next_id: u64,
}

/// An instant to start at: 2025-11-21T00:00:00Z.
pub const START_NS: u64 = 1_763_683_200_000_000_000;

/// How a probe Envoy is set up besides its script.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Worker VMs.
    pub workers: usize,
    /// The plugin's failure policy.
    pub failure_policy: FailurePolicy,
    /// Clusters callouts may name.
    pub clusters: Vec<String>,
}

impl Default for Setup {
    fn default() -> Setup {
        Setup {
            workers: 1,
            failure_policy: FailurePolicy::FailClosed,
            clusters: vec!["limits".to_owned()],
        }
    }
}

impl Probe {
    /// One worker running `script`.
    pub fn start(script: Value) -> Probe {
        Probe::try_start(script, &Setup::default()).expect("the probe starts")
    }

    /// An Envoy set up as `setup` says, running `script` (given as both the VM and the plugin
    /// configuration).
    pub fn try_start(script: Value, setup: &Setup) -> Result<Probe, StartError> {
        let host = Host::new().expect("wasmtime");
        let plugin = host.load(&probe_wasm()).expect("the probe loads");
        let script = script.to_string().into_bytes();
        let mut config = EnvoyConfig::new(script.clone(), setup.clusters.iter().cloned());
        config.vm_configuration = script;
        config.workers = setup.workers;
        config.failure_policy = setup.failure_policy;
        config.vm_id = "probe".to_owned();
        config.plugin_name = "probe-plugin".to_owned();
        config.root_id = "probe-root".to_owned();
        let envoy = Envoy::start(&plugin, config, START_NS)?;
        Ok(Probe {
            envoy,
            now_ns: START_NS,
            next_id: 0,
        })
    }

    /// Everything the probe logged, oldest first.
    pub fn events(&self) -> Vec<Event> {
        self.envoy
            .logs()
            .recent()
            .into_iter()
            .filter_map(|line| {
                let fields: Value = serde_json::from_str(&line.message).ok()?;
                fields.get("event")?;
                Some(Event {
                    worker: line.worker,
                    fields,
                })
            })
            .collect()
    }

    /// The `op` events of callback `cb`, in order.
    pub fn ops(&self, cb: &str) -> Vec<Event> {
        self.events()
            .into_iter()
            .filter(|e| e.kind() == "op" && e.cb() == cb)
            .collect()
    }

    /// Sends `request` to `worker` at the probe's clock.
    pub fn send_to(&mut self, worker: usize, mut request: Request) -> Vec<Output> {
        request.id = self.next_id;
        self.next_id += 1;
        self.envoy.begin(worker, request, self.now_ns)
    }

    /// Sends `request` to worker 0.
    pub fn send(&mut self, request: Request) -> Vec<Output> {
        self.send_to(0, request)
    }

    /// Delivers a callout's answer to worker 0.
    pub fn deliver(&mut self, token: u32, reply: CalloutReply) -> Vec<Output> {
        self.envoy.deliver(0, token, reply, self.now_ns)
    }
}

/// A GET of `path` from 203.0.113.9:4711, with `headers` besides the pseudo-headers.
pub fn get(path: &str, headers: &[(&str, &str)]) -> Request {
    let mut all: Vec<(String, Vec<u8>)> = vec![
        (":authority".to_owned(), b"shop.example".to_vec()),
        (":path".to_owned(), path.as_bytes().to_vec()),
        (":method".to_owned(), b"GET".to_vec()),
        (":scheme".to_owned(), b"https".to_vec()),
    ];
    all.extend(
        headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec())),
    );
    Request {
        id: 0,
        headers: all,
        peer: (IpAddr::from([203, 0, 113, 9]), 4711),
        upstream_status: 200,
        upstream_bytes: 5,
    }
}

/// The callouts among `outputs`.
pub fn callouts(outputs: &[Output]) -> Vec<OutgoingCallout> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Callout { callout, .. } => Some(callout.clone()),
            _ => None,
        })
        .collect()
}

/// The statuses of the requests `outputs` completed.
pub fn completed_statuses(outputs: &[Output]) -> Vec<u16> {
    completed(outputs).iter().map(|done| done.status).collect()
}

/// The streams that ended among `outputs`.
pub fn completed(outputs: &[Output]) -> Vec<&Completed> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Completed(done) => Some(done),
            _ => None,
        })
        .collect()
}
