//! One simulated Envoy: worker VMs running the plugin, and the HTTP filter chain around it.
//!
//! What it copies from Envoy (each point held against Envoy 1.40 in `docs/fidelity.md`):
//! - start-up runs on the main thread twice (a throw-away canary, then the main thread's own
//!   VM), after a base VM that is only initialized, then once per worker; `on_vm_start` or
//!   `on_configure` returning false rejects the configuration;
//! - one VM per worker, each with its own root context (id 1); stream contexts from 2;
//! - request headers are lower-cased and carry `:authority`, `:path`, `:method`, `:scheme`,
//!   plus the `x-request-id` and `x-forwarded-proto` Envoy's connection manager adds;
//! - `continue_stream` and local replies take effect after the callback returns; a local reply
//!   passes back through this filter's response callbacks; a second one sent from them takes
//!   the first one's place;
//! - a stream ends with `on_log`, `on_done`, `on_delete`;
//! - a trap fails the VM; the failure policy then answers 503 (`wasm_fail_stream`) for that
//!   stream and every later one, or (`FAIL_OPEN`) for that stream and skips the filter for
//!   every later one; or, with `FAIL_RELOAD`, the next stream
//!   past the reload backoff gets a new VM (Envoy's `PluginConfig::maybeReloadHandleIfNeeded`),
//!   while the failed VM's streams and callouts stay with it;
//! - a paused stream nothing resumes ends with Envoy's stream idle timeout (408).
//!
//! The instance does no I/O: callouts and tick periods come out as [`Output`]s, and answers go
//! back in through [`Envoy::deliver`]; the replay drives the clock.

use std::collections::BTreeSet;

// Looked up by every host call: a fast hash, not a DoS-resistant one (no key here is chosen
// by a client).
use rustc_hash::FxHashMap as HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use crate::log_sink::{Level, LogSink};
use crate::metric_registry::MetricRegistry;
use crate::shared_store::SharedData;
use crate::state::{CalloutReply, LocalReply, OutgoingCallout};

use crate::{Plugin, Vm, VmFailed, VmInfo};

mod chain;
mod lifecycle;

/// The root context's id in every VM.
const ROOT_CONTEXT: u32 = 1;

/// The worker label of the main thread's VMs (the canary's among them) in logs.
pub const MAIN_THREAD: usize = usize::MAX;

/// What the plugin's `failure_policy` does when its VM has failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Answer 503 (Envoy's default).
    FailClosed,
    /// Skip the filter from the next stream on (the stream whose callback trapped still
    /// gets 503).
    FailOpen,
    /// Answer 503, and give the worker a new VM on the first stream at least `backoff_ms`
    /// after the last load (`reload_config.backoff.base_interval`, 1 s unless set). Envoy
    /// jitters the interval upwards; the simulator waits exactly the base interval.
    FailReload {
        /// The backoff's base interval in milliseconds.
        backoff_ms: u64,
    },
}

/// What `FAIL_RELOAD` did: Envoy's `vm_reload_backoff`, `vm_reload_success` and
/// `vm_reload_failure` events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reloads {
    /// Streams that found the VM failed within the backoff.
    pub backoff: u64,
    /// New VMs started.
    pub success: u64,
    /// New VMs that failed to start.
    pub failure: u64,
}

/// How an Envoy is set up.
#[derive(Debug, Clone)]
pub struct EnvoyConfig {
    /// Worker threads, one VM each.
    pub workers: usize,
    /// The plugin's `vm_id`.
    pub vm_id: String,
    /// The plugin's name.
    pub plugin_name: String,
    /// The plugin's root id.
    pub root_id: String,
    /// The VM configuration.
    pub vm_configuration: Vec<u8>,
    /// The plugin configuration.
    pub plugin_configuration: Vec<u8>,
    /// Clusters callouts may name.
    pub clusters: BTreeSet<String>,
    /// The failure policy.
    pub failure_policy: FailurePolicy,
    /// Echo module logs at this level and above to stderr.
    pub log_echo: Option<Level>,
    /// Its node id (the `node.id` property), which names it, among others, as a lease holder.
    pub node_id: String,
}

impl EnvoyConfig {
    /// One worker, the names Envoy examples use, and `configuration` for the plugin.
    pub fn new(
        configuration: impl Into<Vec<u8>>,
        clusters: impl IntoIterator<Item = String>,
    ) -> EnvoyConfig {
        EnvoyConfig {
            workers: 1,
            vm_id: "sluice".to_owned(),
            plugin_name: "sluice".to_owned(),
            root_id: "sluice".to_owned(),
            vm_configuration: Vec::new(),
            plugin_configuration: configuration.into(),
            clusters: clusters.into_iter().collect(),
            failure_policy: FailurePolicy::FailClosed,
            log_echo: None,
            node_id: "envoy".to_owned(),
        }
    }
}

/// Why an Envoy did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The plugin refused its configuration; the module's log says why.
    #[error("the plugin rejected its configuration{}", .log.iter().map(|l| format!("\n  {l}")).collect::<String>())]
    Rejected {
        /// What the module logged at warn and above.
        log: Vec<String>,
    },
    /// A VM trapped during start-up.
    #[error("{0}")]
    Failed(#[from] VmFailed),
}

/// A request as it reaches Envoy.
#[derive(Debug, Clone)]
pub struct Request {
    /// The caller's id for it, returned with its outcome.
    pub id: u64,
    /// Headers, pseudo-headers included; names are lower-cased on the way in.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The downstream peer.
    pub peer: (IpAddr, u16),
    /// What the upstream will answer if the request gets there.
    pub upstream_status: u16,
    /// The upstream's body size.
    pub upstream_bytes: u64,
}

/// A finished request.
#[derive(Debug, Clone)]
pub struct Completed {
    /// The request's id.
    pub id: u64,
    /// The worker that served it.
    pub worker: usize,
    /// The response status.
    pub status: u16,
    /// The response headers, as sent to the client.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Whether the response was a local reply, and its details.
    pub local_reply: Option<String>,
    /// The filter state the module set (`wasm.` keys), as an access log would see it.
    pub filter_state: Vec<(Vec<u8>, Vec<u8>)>,
    /// When it arrived and when it ended, ns.
    pub started_ns: u64,
    /// When it ended, ns.
    pub ended_ns: u64,
}

/// What the instance asks of its driver.
#[derive(Debug)]
pub enum Output {
    /// Send this callout; deliver its answer with [`Envoy::deliver`].
    Callout {
        /// The worker whose VM made it.
        worker: usize,
        /// The callout.
        callout: OutgoingCallout,
    },
    /// The worker's tick period changed (0: stopped).
    TickPeriod {
        /// The worker.
        worker: usize,
        /// Milliseconds.
        period_ms: u32,
    },
    /// A stream is paused; end it with [`Envoy::idle_timeout`] if still paused then.
    Paused {
        /// The worker.
        worker: usize,
        /// Its context id.
        context: u32,
    },
    /// A request is done.
    Completed(Completed),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting in the request path.
    RequestPaused,
    /// Waiting in the response path.
    ResponsePaused,
    /// A local reply asked for after the first one's response callbacks had returned: left
    /// hanging until the idle timeout, as envoy#28826 describes (not yet seen in Envoy 1.40,
    /// where a second reply from those callbacks takes the first one's place).
    Hung,
}

struct StreamState {
    request: Request,
    phase: Phase,
    started_ns: u64,
    local_reply: Option<LocalReply>,
    /// The filter is skipped for this stream (its VM failed, fail-open).
    bypass: bool,
    /// The worker's VM it began on (see [`Worker::generation`]).
    vm_generation: u32,
}

struct Worker {
    vm: Vm,
    next_context: u32,
    streams: HashMap<u32, StreamState>,
    tick_period_ms: u32,
    /// How many times the worker's VM was reloaded: a stream whose VM is gone is never
    /// called into again.
    generation: u32,
    /// When the VM was last loaded (FAIL_RELOAD's backoff counts from there).
    loaded_ns: u64,
    /// The first callout token of the current VM: answers to older tokens were for a VM
    /// that is gone, and Envoy drops them with it.
    first_token: u32,
}

/// One Envoy process.
pub struct Envoy {
    config: EnvoyConfig,
    plugin: Plugin,
    info: VmInfo,
    clusters: Arc<BTreeSet<String>>,
    reloads: Reloads,
    workers: Vec<Worker>,
    shared: Arc<SharedData>,
    metrics: Arc<MetricRegistry>,
    logs: LogSink,
    now_ns: u64,
}

impl Envoy {
    /// Starts the canary and the workers' VMs at time `now_ns`.
    pub fn start(plugin: &Plugin, config: EnvoyConfig, now_ns: u64) -> Result<Envoy, StartError> {
        let info = VmInfo {
            vm_id: config.vm_id.clone(),
            plugin_name: config.plugin_name.clone(),
            root_id: config.root_id.clone(),
            vm_configuration: config.vm_configuration.clone(),
            plugin_configuration: config.plugin_configuration.clone(),
            node_id: config.node_id.clone(),
        };
        let mut envoy = Envoy {
            clusters: Arc::new(config.clusters.clone()),
            logs: LogSink::new(config.log_echo),
            config,
            plugin: plugin.clone(),
            info,
            reloads: Reloads::default(),
            workers: Vec::new(),
            shared: Arc::new(SharedData::default()),
            metrics: Arc::new(MetricRegistry::default()),
            now_ns,
        };
        // Envoy's main thread (as Envoy 1.40 does it): the base VM, initialized and never
        // started; the canary, started and thrown away; and the main thread's own VM, started
        // as a worker's is, which gets no streams. Start-up runs N+2 times, and the shared-data
        // writes of both main-thread start-ups persist.
        drop(envoy.instantiate(MAIN_THREAD, now_ns)?);
        drop(envoy.new_vm(MAIN_THREAD, now_ns)?);
        drop(envoy.new_vm(MAIN_THREAD, now_ns)?);
        envoy.workers = (0..envoy.config.workers.max(1))
            .map(|w| {
                Ok(Worker {
                    vm: envoy.new_vm(w, now_ns)?,
                    next_context: ROOT_CONTEXT + 1,
                    streams: HashMap::default(),
                    tick_period_ms: 0,
                    generation: 0,
                    loaded_ns: now_ns,
                    first_token: 0,
                })
            })
            .collect::<Result<Vec<_>, StartError>>()?;
        Ok(envoy)
    }

    /// Whether stream `context` on `worker` is still open.
    pub fn is_open(&self, worker: usize, context: u32) -> bool {
        self.workers
            .get(worker)
            .is_some_and(|w| w.streams.contains_key(&context))
    }

    /// Whether any request is still open.
    pub fn has_open_streams(&self) -> bool {
        self.workers.iter().any(|w| !w.streams.is_empty())
    }

    /// The number of workers.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// The worker a client's connection lands on (connections stick to one worker).
    pub fn worker_for(&self, peer: &IpAddr) -> usize {
        let hash = match peer {
            IpAddr::V4(v4) => u64::from(u32::from(*v4)),
            IpAddr::V6(v6) => u128::from(*v6) as u64,
        };
        (hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % self.workers.len()
    }

    /// The stats.
    pub fn metrics(&self) -> &MetricRegistry {
        &self.metrics
    }

    /// The shared data.
    pub fn shared_data(&self) -> &SharedData {
        &self.shared
    }

    /// The vm_id (the key of [`Envoy::shared_data`]).
    pub fn vm_id(&self) -> &str {
        &self.config.vm_id
    }

    /// The module's logs.
    pub fn logs(&self) -> &LogSink {
        &self.logs
    }

    /// Worker `worker`'s tick period in ms (0: none).
    pub fn tick_period_ms(&self, worker: usize) -> u32 {
        self.workers.get(worker).map_or(0, |w| w.tick_period_ms)
    }

    /// Whether worker `worker`'s VM has failed.
    pub fn failed(&self, worker: usize) -> Option<&str> {
        self.workers.get(worker).and_then(|w| w.vm.failure())
    }

    fn set_now(&mut self, worker: usize, now_ns: u64) {
        self.now_ns = now_ns;
        self.workers[worker].vm.set_now(now_ns);
    }

    /// A request arrives on `worker` at `now_ns`.
    pub fn begin(&mut self, worker: usize, request: Request, now_ns: u64) -> Vec<Output> {
        self.set_now(worker, now_ns);
        let mut out = Vec::new();
        self.reload_if_due(worker, now_ns, &mut out);
        let w = &mut self.workers[worker];
        let context = w.next_context;
        w.next_context += 1;
        let host = request.stream_host(now_ns, context);
        let failed = w.vm.failure().is_some();
        w.streams.insert(
            context,
            StreamState {
                request,
                phase: Phase::RequestPaused,
                started_ns: now_ns,
                local_reply: None,
                bypass: false,
                vm_generation: w.generation,
            },
        );
        if failed {
            self.vm_failed(worker, context, false, &mut out);
            return out;
        }
        let result =
            w.vm.create_stream(context, host)
                .and_then(|()| w.vm.on_request_headers(context, true));
        match result {
            Ok((action, effects)) => {
                let continued = self.apply(worker, context, effects, &mut out);
                if action == crate::abi::Action::Continue || continued {
                    self.forward_upstream(worker, context, &mut out);
                } else {
                    self.settle(worker, context, &mut out);
                }
            }
            Err(_) => self.vm_failed(worker, context, true, &mut out),
        }
        out
    }

    /// A callout's answer reaches `worker` at `now_ns`.
    pub fn deliver(
        &mut self,
        worker: usize,
        token: u32,
        reply: CalloutReply,
        now_ns: u64,
    ) -> Vec<Output> {
        self.set_now(worker, now_ns);
        let mut out = Vec::new();
        let w = &self.workers[worker];
        if w.vm.failure().is_some() || token < w.first_token {
            // Envoy drops answers to a failed VM (or to one reloaded since); its paused
            // streams wait for the idle timeout.
            return out;
        }
        match self.workers[worker].vm.on_http_call_response(token, reply) {
            Ok(effects) => self.after_root_callback(worker, effects, &mut out),
            Err(_) => self.fail_paused_streams(worker, &mut out),
        }
        out
    }

    /// The worker's tick fires at `now_ns`.
    pub fn tick(&mut self, worker: usize, now_ns: u64) -> Vec<Output> {
        self.set_now(worker, now_ns);
        let mut out = Vec::new();
        if self.workers[worker].vm.failure().is_some() {
            return out;
        }
        match self.workers[worker].vm.on_tick() {
            Ok(effects) => self.after_root_callback(worker, effects, &mut out),
            Err(_) => self.fail_paused_streams(worker, &mut out),
        }
        out
    }

    /// Envoy's stream idle timeout: a stream still paused at `now_ns` ends with 408.
    pub fn idle_timeout(&mut self, worker: usize, context: u32, now_ns: u64) -> Vec<Output> {
        self.set_now(worker, now_ns);
        let mut out = Vec::new();
        if self.workers[worker].streams.contains_key(&context) {
            let reply = LocalReply {
                status: 408,
                details: "stream_idle_timeout".into(),
                body: b"stream timeout".to_vec(),
                headers: Vec::new(),
            };
            self.finish_without_filter(worker, context, reply, &mut out);
        }
        out
    }

    /// Streams not yet finished, by worker.
    pub fn open_streams(&self) -> Vec<(usize, u32)> {
        self.workers
            .iter()
            .enumerate()
            .flat_map(|(w, worker)| worker.streams.keys().map(move |c| (w, *c)))
            .collect()
    }
}
