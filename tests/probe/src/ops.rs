//! Each step of a script, as host calls, and what they answered.

use serde_json::{Value, json};

use crate::abi;
use crate::script::Op;
use crate::state::with;

/// Bytes as text where they are text, with the raw bytes beside.
fn shown(bytes: &[u8]) -> Value {
    json!({"text": String::from_utf8_lossy(bytes), "raw": bytes})
}

fn pairs(answer: abi::Answer<Vec<u8>>) -> Value {
    let (status, bytes) = answer;
    match bytes.as_deref().map(abi::decode_pairs) {
        Some(Some(pairs)) => json!({"status": status, "pairs": pairs}),
        Some(None) => json!({"status": status, "malformed": true}),
        None => json!({"status": status}),
    }
}

fn bytes(answer: abi::Answer<Vec<u8>>) -> Value {
    match answer {
        (status, Some(value)) => json!({"status": status, "value": shown(&value)}),
        (status, None) => json!({"status": status}),
    }
}

fn metric(name: &str) -> u32 {
    with(|p| p.metrics.get(name).copied().unwrap_or(u32::MAX))
}

/// Runs `op`; the answer is logged with the op's name.
pub fn run(op: &Op) -> Value {
    let (name, mut result) = match op {
        Op::Log { message } => ("log", json!({"message": message})),
        Op::LogAt { level, message } => ("log_at", json!({"status": abi::log(*level, message)})),
        Op::GrpcCall {
            cluster,
            service,
            method,
            timeout_ms,
        } => {
            let (status, token) = abi::grpc_call(cluster, service, method, *timeout_ms);
            ("grpc_call", json!({"status": status, "token": token}))
        }
        Op::RegisterQueue { name } => {
            let (status, id) = abi::register_queue(name);
            ("register_queue", json!({"status": status, "id": id}))
        }
        Op::Enqueue { vm_id, name, value } => {
            let (resolved, status) = abi::enqueue(vm_id, name, value);
            (
                "enqueue",
                json!({"resolve_status": resolved, "status": status}),
            )
        }
        Op::Random { len } => {
            let (errno, bytes) = abi::random(*len);
            ("random", json!({"errno": errno, "value": shown(&bytes)}))
        }
        Op::Headers { map } => ("headers", pairs(abi::header_pairs(*map))),
        Op::Header { map, name } => ("header", bytes(abi::header_value(*map, name))),
        Op::HeaderSize { map } => {
            let (status, size) = abi::header_map_size(*map);
            ("header_size", json!({"status": status, "size": size}))
        }
        Op::AddHeader { map, name, value } => (
            "add_header",
            json!({"status": abi::add_header(*map, name, value)}),
        ),
        Op::Property { path } => {
            let joined = path.join("\0");
            ("property", bytes(abi::get_property(joined.as_bytes())))
        }
        Op::SetProperty { path, value } => (
            "set_property",
            json!({"status": abi::set_property(path.as_bytes(), value.as_bytes())}),
        ),
        Op::Buffer { kind } => ("buffer", bytes(abi::buffer(*kind))),
        Op::HttpCall {
            cluster,
            headers,
            body,
            timeout_ms,
        } => {
            let (status, token) = abi::http_call(
                cluster,
                &abi::encode_pairs(headers),
                body.as_bytes(),
                *timeout_ms,
            );
            ("http_call", json!({"status": status, "token": token}))
        }
        Op::CalloutAnswer => (
            "callout_answer",
            json!({
                "headers": pairs(abi::header_pairs(6)),
                "status_header": bytes(abi::header_value(6, ":status")),
                "body": bytes(abi::buffer(4)),
                "trailers": pairs(abi::header_pairs(7)),
            }),
        ),
        Op::LocalReply {
            status,
            body,
            headers,
            details,
        } => (
            "local_reply",
            json!({"status": abi::local_response(*status, details, body.as_bytes(), &abi::encode_pairs(headers))}),
        ),
        Op::Continue { kind } => ("continue", json!({"status": abi::continue_stream(*kind)})),
        Op::Close { kind } => ("close", json!({"status": abi::close_stream(*kind)})),
        Op::Tick { ms } => ("tick", json!({"status": abi::set_tick_period(*ms)})),
        Op::SharedGet { key } => match abi::shared_get(key) {
            (status, Some((value, cas))) => (
                "shared_get",
                json!({"status": status, "value": shown(&value), "cas": cas}),
            ),
            (status, None) => ("shared_get", json!({"status": status})),
        },
        Op::SharedSet { key, value, cas } => (
            "shared_set",
            json!({"status": abi::shared_set(key, value.as_bytes(), *cas)}),
        ),
        Op::SharedIncrement { key } => ("shared_increment", increment(key)),
        Op::DefineMetric { kind, name } => {
            let (status, id) = abi::define_metric(*kind, name);
            if let Some(id) = id {
                with(|p| p.metrics.insert(name.clone(), id));
            }
            ("define_metric", json!({"status": status, "id": id}))
        }
        Op::IncrementMetric { name, by } => (
            "increment_metric",
            json!({"status": abi::increment_metric(metric(name), *by)}),
        ),
        Op::RecordMetric { name, value } => (
            "record_metric",
            json!({"status": abi::record_metric(metric(name), *value)}),
        ),
        Op::GetMetric { name } => {
            let (status, value) = abi::get_metric(metric(name));
            ("get_metric", json!({"status": status, "value": value}))
        }
        Op::Time => {
            let (status, now) = abi::now_ns();
            ("time", json!({"status": status, "ns": now}))
        }
        Op::Status => {
            let (status, code, message) = abi::get_status();
            let message = message.as_deref().map(shown);
            (
                "status",
                json!({"status": status, "code": code, "message": message}),
            )
        }
        Op::Done => ("done", json!({"status": abi::done()})),
        Op::Print { fd, message } => ("print", json!({"written": print(*fd, message)})),
        Op::EffectiveContext { context } => {
            let id = context.unwrap_or_else(|| with(|p| p.newest_stream));
            (
                "effective_context",
                json!({"status": abi::set_effective_context(id), "context": id}),
            )
        }
        Op::Trap => trap(),
    };
    if let Value::Object(fields) = &mut result {
        fields.insert("op".into(), name.into());
    }
    result
}

/// Writes through WASI's `fd_write`, unbuffered, so that each call is one write.
fn print(fd: u32, message: &str) -> bool {
    use std::io::Write;
    match fd {
        1 => {
            std::io::stdout().write_all(message.as_bytes()).is_ok()
                && std::io::stdout().flush().is_ok()
        }
        _ => std::io::stderr().write_all(message.as_bytes()).is_ok(),
    }
}

/// A counter in shared data, incremented with compare-and-swap.
fn increment(key: &str) -> Value {
    for attempt in 1..=8 {
        let (status, current) = abi::shared_get(key);
        let (value, cas) = match current {
            Some((bytes, cas)) => (
                String::from_utf8_lossy(&bytes).parse::<u64>().unwrap_or(0),
                cas,
            ),
            None => (0, 0),
        };
        let written = abi::shared_set(key, (value + 1).to_string().as_bytes(), cas);
        if written == 0 {
            return json!({"status": written, "read_status": status, "value": value + 1, "attempts": attempt});
        }
    }
    json!({"status": 8, "attempts": 8})
}

fn trap() -> ! {
    #[cfg(target_arch = "wasm32")]
    core::arch::wasm32::unreachable();
    #[cfg(not(target_arch = "wasm32"))]
    std::process::abort();
}
