//! A worker's VM: made at start and after a failure, replaced on the reload policy's terms,
//! and what becomes of its streams when it fails.

use std::sync::Arc;

use super::{Envoy, EnvoyConfig, FailurePolicy, Output, ROOT_CONTEXT, Reloads, StartError};
use crate::log_sink::Level;
use crate::state::LocalReply;
use crate::{Host, HostState, Vm};

impl Envoy {
    /// A VM for `worker` ([`MAIN_THREAD`] for the main thread's), instantiated and
    /// initialized (`_initialize`), not started.
    pub(super) fn instantiate(&self, worker: usize, now_ns: u64) -> Result<Vm, StartError> {
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
    pub(super) fn new_vm(&self, worker: usize, now_ns: u64) -> Result<Vm, StartError> {
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
    pub(super) fn reload_if_due(&mut self, worker: usize, now_ns: u64, out: &mut Vec<Output>) {
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

    /// The stream's VM has failed, in one of this stream's callbacks (`trapped_here`) or
    /// before it began: apply the failure policy to it.
    pub(super) fn vm_failed(
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
    pub(super) fn fail_paused_streams(&mut self, worker: usize, out: &mut Vec<Output>) {
        let paused: Vec<u32> = self.workers[worker].streams.keys().copied().collect();
        for context in paused {
            out.push(Output::Paused { worker, context });
        }
    }
}
