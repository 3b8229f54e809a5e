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

use crate::host::headers::HeaderMap;
use crate::host::log::{Level, LogSink};
use crate::host::metrics::MetricRegistry;
use crate::host::properties::StreamProperties;
use crate::host::shared_data::SharedData;
use crate::host::state::{
    CalloutReply, LocalReply, MapAccess, OutgoingCallout, StreamAction, StreamHost,
};

use crate::host::{Effects, Host, HostState, Plugin, Vm, VmFailed, VmInfo};

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

    /// A VM for `worker` ([`MAIN_THREAD`] for the main thread's), instantiated and
    /// initialized (`_initialize`), not started.
    fn instantiate(&self, worker: usize, now_ns: u64) -> Result<Vm, StartError> {
        let state = HostState::new(
            self.info.clone(),
            Arc::clone(&self.shared),
            Arc::clone(&self.metrics),
            Arc::clone(&self.clusters),
            self.logs.for_worker(worker),
        );
        let mut vm = Vm::instantiate(&self.plugin, state)?;
        vm.set_now(now_ns);
        Ok(vm)
    }

    /// A started VM for `worker` ([`MAIN_THREAD`] for the main thread's): instantiated, its
    /// root context created, `on_vm_start` and `on_configure` run and accepted.
    fn new_vm(&self, worker: usize, now_ns: u64) -> Result<Vm, StartError> {
        let mut vm = self.instantiate(worker, now_ns)?;
        if vm.start_root(ROOT_CONTEXT)? {
            Ok(vm)
        } else {
            let log = self
                .logs
                .recent()
                .into_iter()
                .filter(|l| l.level >= Level::Warn)
                .map(|l| l.message)
                .collect();
            Err(StartError::Rejected { log })
        }
    }

    /// What FAIL_RELOAD has done so far.
    pub fn reloads(&self) -> Reloads {
        self.reloads
    }

    /// Envoy's FAIL_RELOAD, as a stream begins on a worker whose VM has failed: within the
    /// backoff the stream meets the failed VM; past it, the worker gets a new VM (the load time
    /// is taken either way), whose start-up callouts and tick period are put out.
    fn reload_if_due(&mut self, worker: usize, now_ns: u64, out: &mut Vec<Output>) {
        let FailurePolicy::FailReload { backoff_ms } = self.config.failure_policy else {
            return;
        };
        let w = &self.workers[worker];
        if w.vm.failure().is_none() {
            return;
        }
        if now_ns.saturating_sub(w.loaded_ns) < backoff_ms.saturating_mul(1_000_000) {
            self.reloads.backoff += 1;
            return;
        }
        self.workers[worker].loaded_ns = now_ns;
        match self.new_vm(worker, now_ns) {
            Ok(mut vm) => {
                let w = &mut self.workers[worker];
                // Tokens go on from the failed VM's, so that its answers are told apart.
                let first_token = w.vm.state().callouts.next_token;
                vm.state_mut().callouts.next_token = first_token;
                w.vm = vm;
                w.first_token = first_token;
                w.generation += 1;
                self.reloads.success += 1;
                let effects = self.workers[worker].vm.take_root_effects();
                self.emit_callouts_and_tick(worker, effects.callouts, out);
            }
            Err(_) => self.reloads.failure += 1,
        }
    }

    /// Starts with a fresh host (tests).
    pub fn start_with(
        host: &Host,
        wasm: &[u8],
        config: EnvoyConfig,
        now_ns: u64,
    ) -> anyhow::Result<Envoy> {
        let plugin = host.load(wasm)?;
        Ok(Envoy::start(&plugin, config, now_ns)?)
    }

    /// What start-up asked for: the callouts `on_vm_start` and `on_configure` made and the
    /// tick periods they set. The driver takes these once, before the first request.
    pub fn started(&mut self) -> Vec<Output> {
        let mut out = Vec::new();
        for worker in 0..self.workers.len() {
            let effects = self.workers[worker].vm.take_root_effects();
            self.emit_callouts_and_tick(worker, effects.callouts, &mut out);
        }
        out
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
        let host = stream_host(&request, now_ns, context);
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
                if action == crate::host::abi::Action::Continue || continued {
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

    fn after_root_callback(&mut self, worker: usize, effects: Effects, out: &mut Vec<Output>) {
        self.emit_callouts_and_tick(worker, effects.callouts, out);
        let contexts: Vec<u32> = self.workers[worker].streams.keys().copied().collect();
        for context in contexts {
            let actions = self.workers[worker].vm.take_actions(context);
            if !actions.is_empty() {
                self.apply_actions(worker, context, actions, out);
            }
        }
    }

    fn emit_callouts_and_tick(
        &mut self,
        worker: usize,
        callouts: Vec<OutgoingCallout>,
        out: &mut Vec<Output>,
    ) {
        out.extend(
            callouts
                .into_iter()
                .map(|callout| Output::Callout { worker, callout }),
        );
        let w = &mut self.workers[worker];
        let period = w.vm.tick_period_ms();
        if period != w.tick_period_ms {
            w.tick_period_ms = period;
            out.push(Output::TickPeriod {
                worker,
                period_ms: period,
            });
        }
    }

    /// Emits the callouts of a stream callback and applies its actions; true if the request
    /// was continued.
    fn apply(
        &mut self,
        worker: usize,
        context: u32,
        effects: Effects,
        out: &mut Vec<Output>,
    ) -> bool {
        self.emit_callouts_and_tick(worker, effects.callouts, out);
        let continues = effects.actions.contains(&StreamAction::ContinueRequest);
        let others: Vec<StreamAction> = effects
            .actions
            .into_iter()
            .filter(|a| *a != StreamAction::ContinueRequest)
            .collect();
        self.apply_actions(worker, context, others, out);
        continues
            && self.workers[worker]
                .streams
                .get(&context)
                .is_some_and(|s| s.local_reply.is_none() && s.phase == Phase::RequestPaused)
    }

    fn apply_actions(
        &mut self,
        worker: usize,
        context: u32,
        actions: Vec<StreamAction>,
        out: &mut Vec<Output>,
    ) {
        for action in actions {
            let Some(stream) = self.workers[worker].streams.get_mut(&context) else {
                return;
            };
            match action {
                StreamAction::LocalReply(reply) => {
                    if stream.local_reply.is_some() {
                        stream.phase = Phase::Hung;
                        continue;
                    }
                    stream.local_reply = Some(reply.clone());
                    self.local_reply(worker, context, reply, out);
                }
                StreamAction::ContinueRequest
                    if stream.phase == Phase::RequestPaused && stream.local_reply.is_none() =>
                {
                    self.forward_upstream(worker, context, out);
                }
                StreamAction::ContinueResponse if stream.phase == Phase::ResponsePaused => {
                    self.complete(worker, context, out);
                }
                StreamAction::Reset => {
                    // Envoy's Context::closeStream records these response code details.
                    let reply = LocalReply {
                        status: 0,
                        details: "wasm_close_stream".into(),
                        body: Vec::new(),
                        headers: Vec::new(),
                    };
                    self.finish_without_filter(worker, context, reply, out);
                }
                _ => {}
            }
        }
    }

    fn settle(&mut self, worker: usize, context: u32, out: &mut Vec<Output>) {
        if self.workers[worker].streams.contains_key(&context) {
            out.push(Output::Paused { worker, context });
        }
    }

    /// The request goes on to the upstream, which answers at once with the recorded status.
    fn forward_upstream(&mut self, worker: usize, context: u32, out: &mut Vec<Output>) {
        let w = &mut self.workers[worker];
        let Some(stream) = w.streams.get(&context) else {
            return;
        };
        let (status, bytes, bypass) = (
            stream.request.upstream_status,
            stream.request.upstream_bytes,
            stream.bypass,
        );
        let response = HeaderMap::from_pairs([
            (":status".to_owned(), status.to_string().into_bytes()),
            ("content-length".to_owned(), bytes.to_string().into_bytes()),
            ("content-type".to_owned(), b"text/html".to_vec()),
            ("x-envoy-upstream-service-time".to_owned(), b"0".to_vec()),
        ]);
        if bypass {
            self.finish_response(worker, context, response, out);
            return;
        }
        if let Some(host) = w.vm.state_mut().streams.get_mut(&context) {
            host.request_access = MapAccess::Unavailable;
            host.response_headers = response;
            host.response_access = MapAccess::Writable;
            host.properties.response_code = Some(status);
        }
        match w.vm.on_response_headers(context, true) {
            Ok((action, effects)) => {
                let _ = self.apply(worker, context, effects, out);
                if action == crate::host::abi::Action::Pause
                    && self.workers[worker]
                        .streams
                        .get(&context)
                        .is_some_and(|s| s.local_reply.is_none())
                {
                    if let Some(s) = self.workers[worker].streams.get_mut(&context) {
                        s.phase = Phase::ResponsePaused;
                    }
                    self.settle(worker, context, out);
                } else if self.workers[worker]
                    .streams
                    .get(&context)
                    .is_some_and(|s| s.local_reply.is_none())
                {
                    self.complete(worker, context, out);
                }
            }
            Err(_) => self.vm_failed(worker, context, true, out),
        }
    }

    /// A local reply: its headers pass through this filter's response callbacks, then the
    /// stream ends.
    fn local_reply(
        &mut self,
        worker: usize,
        context: u32,
        reply: LocalReply,
        out: &mut Vec<Output>,
    ) {
        let mut pairs = vec![(":status".to_owned(), reply.status.to_string().into_bytes())];
        pairs.extend(reply.headers.iter().cloned());
        pairs.push((
            "content-length".to_owned(),
            reply.body.len().to_string().into_bytes(),
        ));
        if !reply.body.is_empty() {
            pairs.push(("content-type".to_owned(), b"text/plain".to_vec()));
        }
        let w = &mut self.workers[worker];
        if let Some(host) = w.vm.state_mut().streams.get_mut(&context) {
            host.request_access = MapAccess::Unavailable;
            host.response_headers = HeaderMap::from_pairs(pairs);
            host.response_access = MapAccess::Writable;
            host.properties.response_code = Some(reply.status as u16);
        }
        let result =
            w.vm.on_response_headers(context, reply.body.is_empty())
                .and_then(|(_, effects)| {
                    if reply.body.is_empty() {
                        return Ok(effects);
                    }
                    if let Some(host) = w.vm.state_mut().streams.get_mut(&context) {
                        host.response_body = reply.body.clone();
                    }
                    w.vm.on_response_body(context, reply.body.len(), true)
                        .map(|(_, more)| Effects {
                            actions: effects.actions.into_iter().chain(more.actions).collect(),
                            callouts: effects.callouts.into_iter().chain(more.callouts).collect(),
                        })
                });
        match result {
            Ok(effects) => {
                self.emit_callouts_and_tick(worker, effects.callouts, out);
                // A second local reply from the response path takes the first one's place:
                // its status goes to the client, and the response callbacks do not run again.
                // (Envoy 1.40; older Envoys hung the stream, envoy#28826.)
                let second = effects.actions.into_iter().rev().find_map(|a| match a {
                    StreamAction::LocalReply(reply) => Some(reply),
                    _ => None,
                });
                if let Some(second) = second {
                    self.replace_local_reply(worker, context, second);
                }
                self.complete(worker, context, out);
            }
            Err(_) => self.vm_failed(worker, context, true, out),
        }
    }

    /// `reply` answers the stream instead of the local reply on its way out.
    fn replace_local_reply(&mut self, worker: usize, context: u32, reply: LocalReply) {
        let w = &mut self.workers[worker];
        if let Some(host) = w.vm.state_mut().streams.get_mut(&context) {
            let mut pairs = vec![(":status".to_owned(), reply.status.to_string().into_bytes())];
            pairs.extend(reply.headers.iter().cloned());
            host.response_headers = HeaderMap::from_pairs(pairs);
            host.properties.response_code = Some(reply.status as u16);
        }
        if let Some(stream) = w.streams.get_mut(&context) {
            stream.local_reply = Some(reply);
        }
    }

    /// The response is sent: access-log phase, then `on_log`, `on_done`, `on_delete`.
    fn complete(&mut self, worker: usize, context: u32, out: &mut Vec<Output>) {
        let w = &mut self.workers[worker];
        if let Some(host) = w.vm.state_mut().streams.get_mut(&context) {
            host.request_access = MapAccess::ReadOnly;
            host.response_access = MapAccess::ReadOnly;
        }
        let ended = w.vm.end_stream(context);
        let Some(stream) = w.streams.remove(&context) else {
            return;
        };
        let (headers, filter_state) = match ended {
            Ok(Some(host)) => (
                host.response_headers.into_pairs(),
                host.filter_state.into_iter().collect(),
            ),
            _ => (Vec::new(), Vec::new()),
        };
        let status = headers
            .iter()
            .find(|(k, _)| k == ":status")
            .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse().ok())
            .unwrap_or(0);
        out.push(Output::Completed(Completed {
            id: stream.request.id,
            worker,
            status,
            headers,
            local_reply: stream.local_reply.map(|r| r.details),
            filter_state,
            started_ns: stream.started_ns,
            ended_ns: self.now_ns,
        }));
    }

    fn finish_response(
        &mut self,
        worker: usize,
        context: u32,
        response: HeaderMap,
        out: &mut Vec<Output>,
    ) {
        let Some(stream) = self.workers[worker].streams.remove(&context) else {
            return;
        };
        let status = response
            .get(":status")
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .unwrap_or(0);
        out.push(Output::Completed(Completed {
            id: stream.request.id,
            worker,
            status,
            headers: response.into_pairs(),
            local_reply: stream.local_reply.map(|r| r.details),
            filter_state: Vec::new(),
            started_ns: stream.started_ns,
            ended_ns: self.now_ns,
        }));
    }

    /// Ends a stream with a reply that does not pass through the module (its VM failed, or
    /// Envoy itself answers).
    fn finish_without_filter(
        &mut self,
        worker: usize,
        context: u32,
        reply: LocalReply,
        out: &mut Vec<Output>,
    ) {
        let w = &mut self.workers[worker];
        let on_current_vm = w
            .streams
            .get(&context)
            .is_some_and(|s| s.vm_generation == w.generation);
        if w.vm.failure().is_none() && on_current_vm {
            let _ = w.vm.end_stream(context);
        }
        if let Some(stream) = w.streams.get_mut(&context) {
            stream.local_reply = Some(reply.clone());
        }
        let response =
            HeaderMap::from_pairs([(":status".to_owned(), reply.status.to_string().into_bytes())]);
        self.finish_response(worker, context, response, out);
    }

    /// The stream's VM has failed, in one of this stream's callbacks (`trapped_here`) or
    /// before it began: apply the failure policy to it.
    fn vm_failed(
        &mut self,
        worker: usize,
        context: u32,
        trapped_here: bool,
        out: &mut Vec<Output>,
    ) {
        // FAIL_OPEN skips the filter from the next stream on; the stream whose callback
        // trapped is failed all the same (503 in Envoy 1.40).
        if self.config.failure_policy == FailurePolicy::FailOpen && !trapped_here {
            if let Some(stream) = self.workers[worker].streams.get_mut(&context) {
                stream.bypass = true;
            }
            self.forward_upstream(worker, context, out);
            return;
        }
        let reply = LocalReply {
            status: 503,
            details: "wasm_fail_stream".into(),
            body: Vec::new(),
            headers: Vec::new(),
        };
        self.finish_without_filter(worker, context, reply, out);
    }

    /// A root callback trapped: streams paused on this VM will never be resumed by it.
    fn fail_paused_streams(&mut self, worker: usize, out: &mut Vec<Output>) {
        let paused: Vec<u32> = self.workers[worker].streams.keys().copied().collect();
        for context in paused {
            out.push(Output::Paused { worker, context });
        }
    }
}

/// The host side of a new stream: Envoy's request headers and properties.
fn stream_host(request: &Request, now_ns: u64, context: u32) -> StreamHost {
    let mut headers = HeaderMap::from_pairs(
        request
            .headers
            .iter()
            .map(|(k, v)| (k.as_bytes(), v.as_slice())),
    );
    // Envoy generates an x-request-id only when the request has none; request.id reads it.
    let request_id = match headers.get("x-request-id") {
        Some(id) => String::from_utf8_lossy(id).into_owned(),
        None => {
            let id = format!(
                "{:08x}-0000-4000-8000-{:012x}",
                request.id as u32, request.id
            );
            headers.add(b"x-request-id", id.as_bytes());
            id
        }
    };
    if headers.get("x-forwarded-proto").is_none() {
        let scheme = headers.get(":scheme").unwrap_or(b"http").to_vec();
        headers.add(b"x-forwarded-proto", scheme);
    }
    StreamHost {
        request_headers: headers,
        request_access: MapAccess::Writable,
        response_headers: HeaderMap::default(),
        response_access: MapAccess::Unavailable,
        response_body: Vec::new(),
        properties: StreamProperties {
            source_ip: request.peer.0,
            source_port: request.peer.1,
            destination_ip: IpAddr::from([10, 0, 0, 1]),
            destination_port: 10000,
            request_time_ns: now_ns as i64,
            request_id,
            protocol: "HTTP/1.1".to_owned(),
            route_name: "default".to_owned(),
            cluster_name: "upstream".to_owned(),
            connection_id: u64::from(context),
            response_code: None,
        },
        filter_state: Default::default(),
        actions: Vec::new(),
    }
}
