//! What the probe does in each callback: the script in its configuration.
//!
//! ```json
//! {"on_request_headers": [{"op": "property", "path": ["source", "address"]},
//!                         {"op": "http_call", "cluster": "sluice", "headers": [[":path", "/"]]}],
//!  "returns": {"on_request_headers": "pause"}}
//! ```
//!
//! A step with `"stream": n` runs only in the VM's n-th stream context (1-based).

use serde::Deserialize;

/// The whole script.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    #[serde(default)]
    pub on_context_create: Vec<Step>,
    #[serde(default)]
    pub on_vm_start: Vec<Step>,
    #[serde(default)]
    pub on_configure: Vec<Step>,
    #[serde(default)]
    pub on_request_headers: Vec<Step>,
    #[serde(default)]
    pub on_response_headers: Vec<Step>,
    #[serde(default)]
    pub on_response_body: Vec<Step>,
    #[serde(default)]
    pub on_log: Vec<Step>,
    #[serde(default)]
    pub on_done: Vec<Step>,
    #[serde(default)]
    pub on_delete: Vec<Step>,
    #[serde(default)]
    pub on_tick: Vec<Step>,
    #[serde(default)]
    pub on_http_call_response: Vec<Step>,
    #[serde(default)]
    pub on_queue_ready: Vec<Step>,
    #[serde(default)]
    pub returns: Returns,
}

impl Script {
    /// The steps of callback `name`.
    pub fn steps(&self, name: &str) -> &[Step] {
        match name {
            "on_context_create" => &self.on_context_create,
            "on_vm_start" => &self.on_vm_start,
            "on_configure" => &self.on_configure,
            "on_request_headers" => &self.on_request_headers,
            "on_response_headers" => &self.on_response_headers,
            "on_response_body" => &self.on_response_body,
            "on_log" => &self.on_log,
            "on_done" => &self.on_done,
            "on_delete" => &self.on_delete,
            "on_tick" => &self.on_tick,
            "on_http_call_response" => &self.on_http_call_response,
            "on_queue_ready" => &self.on_queue_ready,
            _ => &[],
        }
    }
}

/// What callbacks return, where it is not the default (true; continue).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Returns {
    pub on_vm_start: Option<bool>,
    pub on_configure: Option<bool>,
    pub on_request_headers: Option<Action>,
    pub on_response_headers: Option<Action>,
}

/// A header callback's answer.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Continue,
    Pause,
}

impl Action {
    pub fn abi(self) -> u32 {
        match self {
            Action::Continue => 0,
            Action::Pause => 1,
        }
    }
}

/// One step: an operation, perhaps for one stream only.
#[derive(Debug, Clone, Deserialize)]
pub struct Step {
    #[serde(flatten)]
    pub op: Op,
    /// Only in the VM's n-th stream context.
    #[serde(default)]
    pub stream: Option<u32>,
}

/// A host call, or something to do with the VM.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    Log {
        message: String,
    },
    Headers {
        map: u32,
    },
    Header {
        map: u32,
        name: String,
    },
    HeaderSize {
        map: u32,
    },
    AddHeader {
        map: u32,
        name: String,
        value: String,
    },
    Property {
        path: Vec<String>,
    },
    SetProperty {
        path: String,
        value: String,
    },
    Buffer {
        kind: u32,
    },
    HttpCall {
        cluster: String,
        headers: Vec<(String, String)>,
        #[serde(default)]
        body: String,
        #[serde(default)]
        timeout_ms: u32,
    },
    /// Reads the answer being delivered: headers (map 6), body (buffer 4), trailers (map 7).
    CalloutAnswer,
    LocalReply {
        status: u32,
        #[serde(default)]
        body: String,
        #[serde(default)]
        headers: Vec<(String, String)>,
        #[serde(default)]
        details: String,
    },
    /// `proxy_continue_stream(kind)`: 0 request, 1 response.
    Continue {
        #[serde(default)]
        kind: u32,
    },
    Close {
        #[serde(default)]
        kind: u32,
    },
    Tick {
        ms: u32,
    },
    SharedGet {
        key: String,
    },
    SharedSet {
        key: String,
        value: String,
        cas: u32,
    },
    /// Read, add one, write back with the CAS read; retried on a mismatch.
    SharedIncrement {
        key: String,
    },
    DefineMetric {
        kind: u32,
        name: String,
    },
    IncrementMetric {
        name: String,
        by: i64,
    },
    RecordMetric {
        name: String,
        value: u64,
    },
    GetMetric {
        name: String,
    },
    Time,
    /// `proxy_get_status`.
    Status,
    /// `proxy_done`.
    Done,
    /// Writes `message` to WASI's stdout (fd 1) or stderr (fd 2), as `print!` does.
    Print {
        fd: u32,
        message: String,
    },
    /// `proxy_set_effective_context`; without `context`, the newest stream context.
    EffectiveContext {
        context: Option<u32>,
    },
    Trap,
    /// `proxy_log` at `level` (0 trace .. 5 critical; above is not a level).
    LogAt {
        level: u32,
        message: String,
    },
    /// `proxy_grpc_call` to the cluster named `cluster`.
    GrpcCall {
        cluster: String,
        service: String,
        method: String,
        #[serde(default)]
        timeout_ms: u32,
    },
    RegisterQueue {
        name: String,
    },
    /// Resolves queue `name` of vm_id `vm_id` and enqueues `value`.
    Enqueue {
        vm_id: String,
        name: String,
        value: String,
    },
    /// WASI `random_get`.
    Random {
        len: usize,
    },
}
