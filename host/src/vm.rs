//! One VM: an instance of the module with its store, and the module's callbacks.
//!
//! Each callback is called for a context: the host calls it makes act on that context until
//! it sets another effective context. A trap fails the VM: every later call is refused with
//! [`VmFailed`], as Envoy skips every callback of a failed VM.

use std::sync::Arc;

use wasmtime::{InstancePre, Store, TypedFunc, WasmParams, WasmResults};

use super::abi::{Action, Status};
use super::state::{CalloutReply, HostState, OutgoingCallout, StreamAction, StreamHost};

/// A compiled, checked module ([`crate::Host::load`]), ready to instantiate as many VMs as
/// wanted.
#[derive(Clone)]
pub struct Plugin {
    pre: InstancePre<HostState>,
}

impl Plugin {
    pub(crate) fn new(pre: InstancePre<HostState>) -> Plugin {
        Plugin { pre }
    }

    /// The instantiable module.
    pub fn pre(&self) -> &InstancePre<HostState> {
        &self.pre
    }
}

/// The VM has trapped; nothing more runs in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("wasm VM failed: {0}")]
pub struct VmFailed(pub String);

/// `proxy_on_http_call_response(root, token, headers, body size, trailers)`.
type CalloutCallback = TypedFunc<(i32, i32, i32, i32, i32), ()>;
/// A stream callback: (context, size, end of stream) to an action.
type StreamCallback = TypedFunc<(i32, i32, i32), i32>;

struct Callbacks {
    on_context_create: Option<TypedFunc<(i32, i32), ()>>,
    on_vm_start: Option<TypedFunc<(i32, i32), i32>>,
    on_configure: Option<TypedFunc<(i32, i32), i32>>,
    on_request_headers: Option<StreamCallback>,
    on_response_headers: Option<StreamCallback>,
    on_response_body: Option<StreamCallback>,
    on_log: Option<TypedFunc<i32, ()>>,
    on_done: Option<TypedFunc<i32, i32>>,
    on_delete: Option<TypedFunc<i32, ()>>,
    on_tick: Option<TypedFunc<i32, ()>>,
    on_http_call_response: Option<CalloutCallback>,
}

/// One instance of the module.
pub struct Vm {
    store: Store<HostState>,
    callbacks: Callbacks,
    failure: Option<String>,
}

/// A callback's effect on a stream, collected after it returned.
#[derive(Debug, Default)]
pub struct Effects {
    /// Actions the stream asked for.
    pub actions: Vec<StreamAction>,
    /// Callouts made.
    pub callouts: Vec<OutgoingCallout>,
}

impl Vm {
    /// Instantiates `plugin` and runs its start-up code (`_initialize`, then `main` if exported,
    /// else `_start`). The root context is not created yet: see [`Vm::start_root`].
    pub fn instantiate(plugin: &Plugin, state: HostState) -> Result<Vm, VmFailed> {
        let engine = plugin.pre().module().engine().clone();
        let mut store = Store::new(&engine, state);
        let instance = plugin
            .pre()
            .instantiate(&mut store)
            .map_err(|e| VmFailed(format!("{e:#}")))?;
        let memory = instance.get_memory(&mut store, "memory");
        let allocator = instance
            .get_typed_func::<i32, i32>(&mut store, "malloc")
            .or_else(|_| {
                instance.get_typed_func::<i32, i32>(&mut store, "proxy_on_memory_allocate")
            })
            .ok();
        store.data_mut().guest.memory = memory;
        store.data_mut().guest.allocator = allocator.map(Arc::new);
        macro_rules! export {
            ($name:literal) => {
                instance.get_typed_func(&mut store, $name).ok()
            };
        }
        let callbacks = Callbacks {
            on_context_create: export!("proxy_on_context_create"),
            on_vm_start: export!("proxy_on_vm_start"),
            on_configure: export!("proxy_on_configure"),
            on_request_headers: export!("proxy_on_request_headers"),
            on_response_headers: export!("proxy_on_response_headers"),
            on_response_body: export!("proxy_on_response_body"),
            on_log: export!("proxy_on_log"),
            on_done: export!("proxy_on_done"),
            on_delete: export!("proxy_on_delete"),
            on_tick: export!("proxy_on_tick"),
            on_http_call_response: export!("proxy_on_http_call_response"),
        };
        let initialize = instance
            .get_typed_func::<(), ()>(&mut store, "_initialize")
            .ok();
        let main = instance
            .get_typed_func::<(i32, i32), i32>(&mut store, "main")
            .ok();
        let start = instance.get_typed_func::<(), ()>(&mut store, "_start").ok();
        let mut vm = Vm {
            store,
            callbacks,
            failure: None,
        };
        if let Some(initialize) = &initialize {
            vm.call(0, initialize, ())?;
            if let Some(main) = &main {
                vm.call(0, main, (0, 0))?;
            }
        } else if let Some(start) = &start {
            vm.call(0, start, ())?;
        }
        Ok(vm)
    }

    /// Creates the root context `root_id`, then `on_vm_start` and `on_configure`. `Ok(false)`
    /// when either returns false: Envoy then rejects the configuration.
    pub fn start_root(&mut self, root_id: u32) -> Result<bool, VmFailed> {
        self.store.data_mut().contexts.root = root_id;
        let root = root_id as i32;
        self.run(root_id, |c| c.on_context_create.as_ref(), (root, 0))?;
        let vm_config = self.store.data().info.vm_configuration.len() as i32;
        if self.run(root_id, |c| c.on_vm_start.as_ref(), (root, vm_config))? == Some(0) {
            return Ok(false);
        }
        let plugin_config = self.store.data().info.plugin_configuration.len() as i32;
        self.store.data_mut().configuring = true;
        let configured = self.run(root_id, |c| c.on_configure.as_ref(), (root, plugin_config));
        self.store.data_mut().configuring = false;
        Ok(configured? != Some(0))
    }

    /// Runs the callback `pick` finds on context `context`, if the module exports it. A VM that
    /// has failed runs nothing more, exported or not.
    ///
    /// The export is borrowed, not cloned: cloning a `TypedFunc` takes a reference on its type
    /// in the engine's registry, about 500 instructions a callback.
    fn run<P: WasmParams, R: WasmResults>(
        &mut self,
        context: u32,
        pick: fn(&Callbacks) -> Option<&TypedFunc<P, R>>,
        params: P,
    ) -> Result<Option<R>, VmFailed> {
        self.check_alive()?;
        let Self {
            store,
            callbacks,
            failure,
        } = self;
        let Some(f) = pick(callbacks) else {
            return Ok(None);
        };
        Self::call_in(store, failure, context, f, params).map(Some)
    }

    /// Runs start-up code, which is not a callback.
    fn call<P: WasmParams, R: WasmResults>(
        &mut self,
        context: u32,
        f: &TypedFunc<P, R>,
        params: P,
    ) -> Result<R, VmFailed> {
        self.check_alive()?;
        Self::call_in(&mut self.store, &mut self.failure, context, f, params)
    }

    fn check_alive(&self) -> Result<(), VmFailed> {
        match &self.failure {
            Some(failure) => Err(VmFailed(failure.clone())),
            None => Ok(()),
        }
    }

    /// Calls `f` on context `context`; a trap fails the VM for good, as in Envoy.
    fn call_in<P: WasmParams, R: WasmResults>(
        store: &mut Store<HostState>,
        failure: &mut Option<String>,
        context: u32,
        f: &TypedFunc<P, R>,
        params: P,
    ) -> Result<R, VmFailed> {
        let contexts = &mut store.data_mut().contexts;
        contexts.current = context;
        contexts.effective = None;
        match f.call(&mut *store, params) {
            Ok(r) => Ok(r),
            Err(trap) => {
                let message = format!("{trap:?}");
                store.data().logs.write(
                    super::log_sink::Level::Critical,
                    format!("wasm VM trapped: {message}"),
                );
                *failure = Some(message.clone());
                Err(VmFailed(message))
            }
        }
    }

    /// Whether the VM has failed, and why.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// The host state.
    pub fn state(&self) -> &HostState {
        self.store.data()
    }

    /// The host state, mutably.
    pub fn state_mut(&mut self) -> &mut HostState {
        self.store.data_mut()
    }

    /// Sets the clock every host call reads.
    pub fn set_now(&mut self, now_ns: u64) {
        self.store.data_mut().now_ns = now_ns;
    }

    /// What root callbacks left to do outside a delivery (start-up's callouts).
    pub fn take_root_effects(&mut self) -> Effects {
        self.effects(None)
    }

    fn effects(&mut self, stream: Option<u32>) -> Effects {
        let state = self.store.data_mut();
        Effects {
            actions: stream
                .and_then(|id| state.streams.get_mut(&id))
                .map(|s| std::mem::take(&mut s.actions))
                .unwrap_or_default(),
            callouts: std::mem::take(&mut state.callouts.outgoing),
        }
    }

    /// Creates stream context `id` with its host side.
    pub fn create_stream(&mut self, id: u32, host: StreamHost) -> Result<(), VmFailed> {
        self.store.data_mut().streams.insert(id, host);
        let root = self.store.data().contexts.root as i32;
        self.run(id, |c| c.on_context_create.as_ref(), (id as i32, root))
            .map(drop)
    }

    /// A stream callback taking (context, size, end of stream) and returning an action.
    fn stream_callback(
        &mut self,
        id: u32,
        callback: fn(&Callbacks) -> Option<&StreamCallback>,
        size: usize,
        end_of_stream: bool,
    ) -> Result<(Action, Effects), VmFailed> {
        let action = self.run(
            id,
            callback,
            (id as i32, size as i32, i32::from(end_of_stream)),
        )?;
        Ok((
            action.map_or(Action::Continue, Action::from_abi),
            self.effects(Some(id)),
        ))
    }

    fn header_count(&self, id: u32, map: fn(&StreamHost) -> usize) -> usize {
        self.store.data().streams.get(&id).map_or(0, map)
    }

    /// `proxy_on_request_headers`.
    pub fn on_request_headers(
        &mut self,
        id: u32,
        end_of_stream: bool,
    ) -> Result<(Action, Effects), VmFailed> {
        let count = self.header_count(id, |s| s.request_headers.len());
        self.stream_callback(id, |c| c.on_request_headers.as_ref(), count, end_of_stream)
    }

    /// `proxy_on_response_headers`.
    pub fn on_response_headers(
        &mut self,
        id: u32,
        end_of_stream: bool,
    ) -> Result<(Action, Effects), VmFailed> {
        let count = self.header_count(id, |s| s.response_headers.len());
        self.stream_callback(id, |c| c.on_response_headers.as_ref(), count, end_of_stream)
    }

    /// `proxy_on_response_body`.
    pub fn on_response_body(
        &mut self,
        id: u32,
        size: usize,
        end_of_stream: bool,
    ) -> Result<(Action, Effects), VmFailed> {
        self.stream_callback(id, |c| c.on_response_body.as_ref(), size, end_of_stream)
    }

    /// `proxy_on_log`, `proxy_on_done`, `proxy_on_delete`, in Envoy's order; the stream's host
    /// side is returned (its filter state is what access logs read).
    pub fn end_stream(&mut self, id: u32) -> Result<Option<StreamHost>, VmFailed> {
        let result = (|| {
            self.run(id, |c| c.on_log.as_ref(), id as i32)?;
            self.run(id, |c| c.on_done.as_ref(), id as i32)?;
            self.run(id, |c| c.on_delete.as_ref(), id as i32)
        })();
        let host = self.store.data_mut().streams.remove(&id);
        result.map(|_| host)
    }

    /// `proxy_on_tick` on the root context.
    pub fn on_tick(&mut self) -> Result<Effects, VmFailed> {
        let root = self.store.data().contexts.root;
        self.run(root, |c| c.on_tick.as_ref(), root as i32)?;
        Ok(self.effects(None))
    }

    /// Delivers a callout's answer to the root context; the actions of every stream the module
    /// touched meanwhile are returned by stream id.
    pub fn on_http_call_response(
        &mut self,
        token: u32,
        reply: CalloutReply,
    ) -> Result<Effects, VmFailed> {
        let root = self.store.data().contexts.root;
        let num_headers = reply.headers.as_ref().map_or(0, |h| h.len()) as i32;
        let body_size = reply.body.as_ref().map_or(0, Vec::len) as i32;
        let num_trailers = reply.trailers.len() as i32;
        let callouts = &mut self.store.data_mut().callouts;
        if reply.headers.is_none() {
            callouts.status = (Status::BrokenConnection as u32, "reset");
        }
        callouts.reply = Some(reply);
        let result = self.run(
            root,
            |c| c.on_http_call_response.as_ref(),
            (
                root as i32,
                token as i32,
                num_headers,
                body_size,
                num_trailers,
            ),
        );
        let callouts = &mut self.store.data_mut().callouts;
        callouts.reply = None;
        callouts.status.1 = "";
        result?;
        Ok(self.effects(None))
    }

    /// Actions recorded for stream `id` by a callback run on another context (the tick, a
    /// callout's answer).
    pub fn take_actions(&mut self, id: u32) -> Vec<StreamAction> {
        self.store
            .data_mut()
            .streams
            .get_mut(&id)
            .map(|s| std::mem::take(&mut s.actions))
            .unwrap_or_default()
    }

    /// The root context's tick period in ms (0: none).
    pub fn tick_period_ms(&self) -> u32 {
        self.store.data().tick_period_ms
    }
}
