//! One VM's host-side state: `Store<HostState>`, one field per ABI area.
//!
//! Host calls reach it through `Caller<'_, HostState>`; each area's module reads and writes its
//! own field. What several VMs of one Envoy share (shared data, metrics, known clusters) sits
//! behind `Arc`s handed in by the Envoy instance.

use std::collections::{BTreeMap, BTreeSet};

// Looked up by every host call: a fast hash, not a DoS-resistant one (no key here is chosen
// by a client).
use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use wasmtime::{Memory, TypedFunc};

use super::header_map::HeaderMap;
use super::log_sink::LogSink;
use super::metric_registry::{MetricRegistry, VmMetrics};
use super::shared_store::SharedData;
use super::stream_properties::StreamProperties;

/// What names this VM and its plugin.
#[derive(Debug, Clone)]
pub struct VmInfo {
    /// The plugin's `vm_id`: VMs with the same id share data.
    pub vm_id: String,
    /// The plugin's name.
    pub plugin_name: String,
    /// The plugin's root id.
    pub root_id: String,
    /// The VM's configuration (buffer 6).
    pub vm_configuration: Vec<u8>,
    /// The plugin's configuration (buffer 7, readable during `on_configure` only).
    pub plugin_configuration: Vec<u8>,
    /// The Envoy's node id (the `node.id` property; Envoy's bootstrap `node.id`).
    pub node_id: String,
}

/// The module's memory and allocator, found after instantiation.
#[derive(Default)]
pub struct Guest {
    /// The exported memory.
    pub memory: Option<Memory>,
    /// `malloc` if exported, else `proxy_on_memory_allocate`. Shared, because a call into it
    /// needs the store the state lives in: an `Arc`'s clone costs a counter, a `TypedFunc`'s a
    /// reference on its type in the engine's registry.
    pub allocator: Option<Arc<TypedFunc<i32, i32>>>,
}

/// Which context host calls act on.
#[derive(Debug, Default)]
pub struct ContextSelector {
    /// The root context's id.
    pub root: u32,
    /// The context the running callback was called for.
    pub current: u32,
    /// Set by `proxy_set_effective_context` during the running callback.
    pub effective: Option<u32>,
}

impl ContextSelector {
    /// Envoy's `contextOrEffectiveContext()`.
    pub fn target(&self) -> u32 {
        self.effective.unwrap_or(self.current)
    }
}

/// Whether a stream's map can be read or written now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapAccess {
    /// Not there (yet, or any more): reads and writes are BadArgument.
    Unavailable,
    /// Readable only (the access-log phase).
    ReadOnly,
    /// Readable and writable.
    Writable,
}

/// Something a stream callback asked the host to do once it returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamAction {
    /// `proxy_continue_stream(request)`.
    ContinueRequest,
    /// `proxy_continue_stream(response)`.
    ContinueResponse,
    /// `proxy_close_stream(request | response)`: reset the stream.
    Reset,
    /// `proxy_send_local_response`.
    LocalReply(LocalReply),
}

/// A reply the filter sends instead of the upstream's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    /// HTTP status.
    pub status: u32,
    /// Envoy's response code details.
    pub details: String,
    /// The body.
    pub body: Vec<u8>,
    /// Additional headers, lower-cased as Envoy does.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// The host side of one HTTP stream.
#[derive(Debug)]
pub struct StreamHost {
    /// Request headers (map 0).
    pub request_headers: HeaderMap,
    /// Whether map 0 is available.
    pub request_access: MapAccess,
    /// Response headers (map 2).
    pub response_headers: HeaderMap,
    /// Whether map 2 is available.
    pub response_access: MapAccess,
    /// The response body (buffer 1), while its callback runs.
    pub response_body: Vec<u8>,
    /// What properties answer.
    pub properties: StreamProperties,
    /// Filter state set with `proxy_set_property`, by Envoy's key (`wasm.` + path).
    pub filter_state: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Actions requested during the running callback.
    pub actions: Vec<StreamAction>,
}

/// A callout's answer while `proxy_on_http_call_response` runs.
#[derive(Debug, Clone)]
pub struct CalloutReply {
    /// Headers (map 6); `None` for a reset, which has none.
    pub headers: Option<HeaderMap>,
    /// Body (buffer 4); `None` for a reset.
    pub body: Option<Vec<u8>>,
    /// Trailers (map 7).
    pub trailers: HeaderMap,
}

/// A callout the module asked for, waiting for the Envoy instance to send it.
#[derive(Debug, Clone)]
pub struct OutgoingCallout {
    /// The token returned to the module.
    pub token: u32,
    /// The cluster named.
    pub cluster: String,
    /// Request headers, lower-cased, pseudo-headers included.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Request body.
    pub body: Vec<u8>,
    /// Timeout in ms; 0 for none.
    pub timeout_ms: u32,
}

/// Callouts: token allocation, the known clusters, and what waits to be sent.
#[derive(Debug)]
pub struct Callouts {
    /// The clusters Envoy knows.
    pub clusters: Arc<BTreeSet<String>>,
    /// The next token (4, 8, 12, ...: the low two bits are the callout kind).
    pub next_token: u32,
    /// Callouts made during the running callback.
    pub outgoing: Vec<OutgoingCallout>,
    /// The answer being delivered.
    pub reply: Option<CalloutReply>,
    /// What `proxy_get_status` answers: Envoy's root context sets the code to
    /// `BrokenConnection` when a callout fails and never clears it (no successful callout
    /// does); the message is "reset" only while the failure is being delivered.
    pub status: (u32, &'static str),
}

/// `Store<HostState>`'s data.
pub struct HostState {
    /// Names and configuration.
    pub info: VmInfo,
    /// The clock every hostcall reads, in ns since the epoch (virtual or wall).
    pub now_ns: u64,
    /// Memory and allocator.
    pub guest: Guest,
    /// Which context calls act on.
    pub contexts: ContextSelector,
    /// Whether the plugin configuration buffer is readable (during `on_configure`).
    pub configuring: bool,
    /// Live streams by context id.
    pub streams: HashMap<u32, StreamHost>,
    /// Callouts.
    pub callouts: Callouts,
    /// The root context's tick period, ms (0: none).
    pub tick_period_ms: u32,
    /// Shared data and queues of this VM's `vm_id`.
    pub shared: Arc<SharedData>,
    /// Metrics.
    pub metrics: VmMetrics,
    /// Where logs go.
    pub logs: LogSink,
    /// State of the deterministic `random_get`.
    pub random_state: u64,
}

impl HostState {
    /// A fresh VM's state.
    pub fn new(
        info: VmInfo,
        shared: Arc<SharedData>,
        metrics: Arc<MetricRegistry>,
        clusters: Arc<BTreeSet<String>>,
        logs: LogSink,
    ) -> HostState {
        HostState {
            info,
            now_ns: 0,
            guest: Guest::default(),
            contexts: ContextSelector::default(),
            configuring: false,
            streams: HashMap::default(),
            callouts: Callouts {
                clusters,
                next_token: 4,
                outgoing: Vec::new(),
                reply: None,
                status: (0, ""),
            },
            tick_period_ms: 0,
            shared,
            metrics: VmMetrics::new(metrics),
            logs,
            random_state: 0x9E37_79B9_7F4A_7C15,
        }
    }

    /// The stream host calls act on, if the target context is a stream.
    pub fn target_stream(&mut self) -> Option<&mut StreamHost> {
        let target = self.contexts.target();
        self.streams.get_mut(&target)
    }
}
