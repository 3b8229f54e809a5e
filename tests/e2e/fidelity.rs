//! The simulator hosts a module as Envoy's proxy-wasm host does: one test per row of
//! `docs/fidelity.md` (which cites the Envoy code each copies), each driving the probe filter
//! (`tests/probe`), which calls the ABI directly and logs exactly what the host passed and
//! answered. The last test holds the table and this file to each other.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use serde_json::json;
use sluice_e2e::misbehaving::{self, Misbehaviour};
use sluice_e2e::probe::{
    CANARY, Event, Probe, START_NS, Setup, callouts, completed, completed_statuses, get,
};
use sluice_host::envoy::{FailurePolicy, Output, StartError};
use sluice_host::header_map::HeaderMap;
use sluice_host::log_sink::Level;
use sluice_host::state::{CalloutReply, OutgoingCallout};
use sluice_sim::connect::Endpoint;
use sluice_sim::replay::Replay;
use sluice_sim::transport::{Dispatcher, Transport};

const OK: u64 = 0;
const NOT_FOUND: u64 = 1;
const BAD_ARGUMENT: u64 = 2;
const CAS_MISMATCH: u64 = 8;

fn entered(events: &[Event], ctx: u64) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.kind() == "enter" && e.ctx() == ctx)
        .map(|e| e.cb().to_owned())
        .collect()
}

fn position(events: &[Event], kind: &str, cb: &str) -> usize {
    events
        .iter()
        .position(|e| e.kind() == kind && e.cb() == cb)
        .unwrap_or_else(|| panic!("no {kind} of {cb} in {events:#?}"))
}

fn answer(status: u16, body: &str) -> CalloutReply {
    CalloutReply {
        headers: Some(HeaderMap::from_pairs([
            (":status".to_owned(), status.to_string().into_bytes()),
            ("content-type".to_owned(), b"text/plain".to_vec()),
        ])),
        body: Some(body.as_bytes().to_vec()),
        trailers: HeaderMap::default(),
    }
}

fn full_headers() -> serde_json::Value {
    json!([
        [":path", "/v1/decide"],
        [":method", "POST"],
        [":authority", "limits"]
    ])
}

// --- loading and start-up -------------------------------------------------------------------

#[test]
fn initialize_runs_first_in_every_vm() {
    let probe = Probe::try_start(
        json!({}),
        &Setup {
            workers: 2,
            ..Setup::default()
        },
    )
    .unwrap();
    let events = probe.events();
    let vms: BTreeSet<usize> = events.iter().map(|e| e.worker).collect();
    assert_eq!(
        vms,
        BTreeSet::from([0, 1, CANARY]),
        "the canary and two workers"
    );
    for vm in vms {
        let mine: Vec<&Event> = events.iter().filter(|e| e.worker == vm).collect();
        assert_eq!(mine[0].kind(), "initialize", "VM {vm}: {mine:#?}");
        assert_eq!(mine[0].fields["again"], false);
        assert!(
            mine.iter()
                .filter(|e| e.kind() == "enter")
                .all(|e| e.fields["initialized"] == true),
            "VM {vm}: a callback ran before _initialize"
        );
    }
}

#[test]
fn each_worker_has_its_own_vm_and_its_own_root_context() {
    let mut probe = Probe::try_start(
        json!({}),
        &Setup {
            workers: 2,
            ..Setup::default()
        },
    )
    .unwrap();
    let starts: Vec<Event> = probe
        .events()
        .into_iter()
        .filter(|e| e.kind() == "enter" && e.cb() == "on_vm_start")
        .collect();
    assert_eq!(
        starts.len(),
        4,
        "canary, the main thread's own VM, 2 workers"
    );
    for start in &starts {
        assert_eq!(start.ctx(), 1, "the root context is 1 in every VM");
        assert_eq!(
            start.args()[2],
            1,
            "each VM has its own memory: started once"
        );
    }
    probe.send_to(0, get("/a", &[]));
    probe.send_to(1, get("/b", &[]));
    let creates: Vec<(usize, Vec<u64>)> = probe
        .events()
        .into_iter()
        .filter(|e| e.kind() == "enter" && e.cb() == "on_context_create" && e.ctx() != 1)
        .map(|e| (e.worker, e.args()))
        .collect();
    assert_eq!(
        creates,
        [(0, vec![2, 1]), (1, vec![2, 1])],
        "stream ids start at 2 in each VM, with the root as parent"
    );
}

#[test]
fn start_up_runs_in_a_canary_first_and_its_shared_data_writes_persist() {
    let probe = Probe::try_start(
        json!({"on_configure": [{"op": "shared_increment", "key": "starts"}]}),
        &Setup {
            workers: 2,
            ..Setup::default()
        },
    )
    .unwrap();
    let configures: Vec<usize> = probe
        .events()
        .into_iter()
        .filter(|e| e.kind() == "enter" && e.cb() == "on_configure")
        .map(|e| e.worker)
        .collect();
    // The canary, then the main thread's own VM, then each worker (as Envoy 1.40:
    // in_envoy::fidelity::start_up_runs_twice_on_the_main_thread_then_in_each_worker).
    assert_eq!(configures, [CANARY, CANARY, 0, 1]);
    let (value, _) = probe
        .envoy
        .shared_data()
        .get("probe", b"starts")
        .expect("written");
    assert_eq!(value, b"4", "N+2 start-ups, the canary's write kept");
}

#[test]
fn on_vm_start_or_on_configure_returning_false_rejects_the_configuration() {
    for returns in [
        json!({"on_vm_start": false}),
        json!({"on_configure": false}),
    ] {
        let started = Probe::try_start(json!({ "returns": returns }), &Setup::default());
        assert!(
            matches!(started, Err(StartError::Rejected { .. })),
            "{returns}: {:?}",
            started.err()
        );
    }
}

// --- streams --------------------------------------------------------------------------------

#[test]
fn a_stream_ends_with_on_log_then_on_done_then_on_delete() {
    let mut probe = Probe::start(json!({}));
    let outputs = probe.send(get("/", &[]));
    assert_eq!(completed_statuses(&outputs), [200]);
    assert_eq!(
        entered(&probe.events(), 2),
        [
            "on_context_create",
            "on_request_headers",
            "on_response_headers",
            "on_log",
            "on_done",
            "on_delete"
        ]
    );
}

#[test]
fn request_headers_are_lower_cased_and_carry_the_pseudo_headers() {
    let mut probe = Probe::start(json!({"on_request_headers": [
        {"op": "headers", "map": 0},
        {"op": "header", "map": 0, "name": "X-Tenant"},
    ]}));
    probe.send(get("/items?page=2", &[("X-Tenant", "acme")]));
    let ops = probe.ops("on_request_headers");
    let pairs = ops[0].pairs();
    for (name, value) in [
        (":authority", "shop.example"),
        (":path", "/items?page=2"),
        (":method", "GET"),
        (":scheme", "https"),
        ("x-tenant", "acme"),
    ] {
        assert!(
            pairs.iter().any(|(k, v)| k == name && v == value),
            "{name}: {pairs:?}"
        );
    }
    assert!(
        pairs.iter().all(|(k, _)| *k == k.to_ascii_lowercase()),
        "{pairs:?}"
    );
    assert_eq!(
        (ops[1].status(), ops[1].text()),
        (OK, "acme"),
        "lookups ignore case"
    );
}

#[test]
fn a_header_read_returns_the_first_value_only() {
    let mut probe = Probe::start(json!({"on_request_headers": [
        {"op": "header", "map": 0, "name": "accept"},
        {"op": "headers", "map": 0},
    ]}));
    probe.send(get("/", &[("accept", "text/html"), ("accept", "*/*")]));
    let ops = probe.ops("on_request_headers");
    assert_eq!(ops[0].text(), "text/html");
    let accepts: Vec<String> = ops[1]
        .pairs()
        .into_iter()
        .filter(|(k, _)| k == "accept")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(accepts, ["text/html", "*/*"], "the pairs carry both");
}

#[test]
fn the_header_map_size_is_its_size_in_bytes_not_its_number_of_pairs() {
    let mut probe = Probe::start(json!({
        "on_request_headers": [
            {"op": "header_size", "map": 0},
            {"op": "headers", "map": 0},
        ],
        "on_log": [{"op": "header_size", "map": 0}],
    }));
    probe.send(get("/", &[]));
    let ops = probe.ops("on_request_headers");
    let pairs = ops[1].pairs();
    let bytes: usize = pairs.iter().map(|(k, v)| k.len() + v.len()).sum();
    assert_eq!(ops[0].fields["size"].as_u64(), Some(bytes as u64));
    assert_ne!(bytes, pairs.len());
    assert_eq!(
        probe.ops("on_log")[0].status(),
        BAD_ARGUMENT,
        "Envoy sizes only a map it could modify: none in the access-log phase"
    );
}

#[test]
fn the_plugin_configuration_is_readable_only_during_on_configure() {
    let script = json!({
        "on_configure": [{"op": "buffer", "kind": 7}],
        "on_request_headers": [{"op": "buffer", "kind": 7}, {"op": "buffer", "kind": 6}],
    });
    let mut probe = Probe::start(script.clone());
    probe.send(get("/", &[]));
    let configure = probe.ops("on_configure");
    let configured: serde_json::Value = serde_json::from_str(configure[0].text()).unwrap();
    assert_eq!(configured, script, "the plugin's configuration");
    let ops = probe.ops("on_request_headers");
    assert_eq!(ops[0].status(), NOT_FOUND, "outside on_configure");
    assert_eq!(ops[1].status(), OK, "the VM's configuration, at any time");
}

#[test]
fn properties_are_encoded_as_envoy_encodes_them() {
    let path = |p: &[&str]| json!({"op": "property", "path": p});
    let mut probe = Probe::start(json!({"on_request_headers": [
        path(&["source", "address"]),
        path(&["source", "port"]),
        path(&["request", "time"]),
        path(&["request", "path"]),
        path(&["request", "url_path"]),
        path(&["request", "query"]),
        path(&["request", "method"]),
        path(&["request", "host"]),
        path(&["plugin_name"]),
        path(&["plugin_root_id"]),
        path(&["plugin_vm_id"]),
        path(&["no", "such", "property"]),
    ]}));
    probe.now_ns = START_NS + 1_500_000_000;
    probe.send(get("/items?page=2", &[]));
    let ops = probe.ops("on_request_headers");
    assert_eq!(
        ops[0].text(),
        "203.0.113.9:4711",
        "source.address is ip:port"
    );
    assert_eq!(ops[1].raw(), 4711i64.to_le_bytes(), "source.port: int64 LE");
    assert_eq!(
        ops[2].raw(),
        ((START_NS + 1_500_000_000) as i64).to_le_bytes(),
        "request.time: int64 ns"
    );
    let texts: Vec<&str> = ops[3..11].iter().map(Event::text).collect();
    assert_eq!(
        texts,
        [
            "/items?page=2",
            "/items",
            "page=2",
            "GET",
            "shop.example",
            "probe-plugin",
            "probe-root",
            "probe"
        ]
    );
    assert_eq!(ops[11].status(), NOT_FOUND, "an unknown property");
}

#[test]
fn the_other_stream_properties_are_encoded_as_envoy_encodes_them() {
    let path = |p: &[&str]| json!({"op": "property", "path": p});
    let mut probe = Probe::start(json!({
        "on_request_headers": [
            path(&["destination", "address"]),
            path(&["destination", "port"]),
            path(&["request", "scheme"]),
            path(&["request", "referer"]),
            path(&["request", "useragent"]),
            path(&["request", "id"]),
            path(&["request", "protocol"]),
            path(&["request", "headers", "x-tenant"]),
            path(&["route_name"]),
            path(&["cluster_name"]),
            path(&["node", "id"]),
            path(&["connection_id"]),
            path(&["request", "headers"]),
            {"op": "set_property", "path": "tenant_seen", "value": "acme"},
            path(&["tenant_seen"]),
        ],
        "on_response_headers": [path(&["response", "code"])],
    }));
    probe.send(get(
        "/",
        &[
            ("referer", "https://shop.example/cart"),
            ("user-agent", "probe/1"),
            ("x-request-id", "req-42"),
            ("x-tenant", "acme"),
        ],
    ));
    let ops = probe.ops("on_request_headers");
    let node_id = sluice_host::envoy::EnvoyConfig::new(Vec::new(), Vec::<String>::new()).node_id;
    assert_eq!(ops[0].text(), "10.0.0.1:10000");
    assert_eq!(ops[1].raw(), 10000i64.to_le_bytes(), "int64 LE");
    let texts: Vec<&str> = ops[2..11].iter().map(Event::text).collect();
    assert_eq!(
        texts,
        [
            "https",
            "https://shop.example/cart",
            "probe/1",
            "req-42",
            "HTTP/1.1",
            "acme",
            "default",
            "upstream",
            node_id.as_str(),
        ],
        "strings raw; request.id is the request's own x-request-id"
    );
    assert_eq!(ops[11].raw().len(), 8, "connection_id: uint64 LE");
    let raw = ops[12].raw();
    let headers = sluice_host::abi::decode_pairs(&raw);
    assert!(
        headers.contains(&(&b"x-tenant"[..], &b"acme"[..])),
        "request.headers: a serialized map"
    );
    assert_eq!(ops[13].status(), OK);
    assert_eq!(
        ops[14].text(),
        "acme",
        "set_property is read back as filter state"
    );
    assert_eq!(
        probe.ops("on_response_headers")[0].raw(),
        200i64.to_le_bytes(),
        "response.code: int64 LE"
    );
}

#[test]
fn an_ipv6_source_address_is_bracketed() {
    let mut probe = Probe::start(json!({"on_request_headers": [
        {"op": "property", "path": ["source", "address"]},
    ]}));
    let mut request = get("/", &[]);
    request.peer = ("2001:db8::7".parse::<IpAddr>().unwrap(), 8443);
    probe.send(request);
    assert_eq!(
        probe.ops("on_request_headers")[0].text(),
        "[2001:db8::7]:8443"
    );
}

#[test]
fn a_map_that_is_not_there_is_bad_argument_and_in_on_log_not_found() {
    let read = |map: u32| json!({"op": "header", "map": map, "name": ":path"});
    let mut probe = Probe::start(json!({
        "on_request_headers": [read(1)],
        "on_response_headers": [read(0)],
        "on_log": [read(0), read(1)],
    }));
    probe.send(get("/gone", &[]));
    assert_eq!(
        probe.ops("on_request_headers")[0].status(),
        BAD_ARGUMENT,
        "no request trailers"
    );
    assert_eq!(
        probe.ops("on_response_headers")[0].status(),
        BAD_ARGUMENT,
        "the request headers have gone upstream"
    );
    let log = probe.ops("on_log");
    assert_eq!((log[0].status(), log[0].text()), (OK, "/gone"));
    assert_eq!(log[1].status(), NOT_FOUND, "access-log phase");
}

#[test]
fn the_clock_is_the_replay_clock() {
    let mut probe = Probe::start(json!({"on_request_headers": [{"op": "time"}]}));
    probe.now_ns = START_NS + 42;
    probe.send(get("/", &[]));
    assert_eq!(
        probe.ops("on_request_headers")[0].fields["ns"].as_u64(),
        Some(START_NS + 42)
    );
}

#[test]
fn wasi_stdout_and_stderr_become_info_and_error_log_lines_without_their_trailing_newline() {
    let mut probe = Probe::start(json!({"on_request_headers": [
        {"op": "print", "fd": 1, "message": "to stdout\n"},
        {"op": "print", "fd": 2, "message": "to stderr"},
        {"op": "print", "fd": 2, "message": "\n"},
    ]}));
    probe.send(get("/", &[]));
    let lines: Vec<(Level, String)> = probe
        .envoy
        .logs()
        .recent()
        .into_iter()
        .filter(|l| !l.message.starts_with('{'))
        .map(|l| (l.level, l.message))
        .collect();
    assert_eq!(
        lines,
        [
            (Level::Info, "to stdout".to_owned()),
            (Level::Error, "to stderr".to_owned()),
            (Level::Error, String::new())
        ]
    );
}

#[test]
fn proxy_done_is_not_found_while_no_vm_is_shutting_down() {
    let mut probe = Probe::start(json!({"on_request_headers": [{"op": "done"}]}));
    probe.send(get("/", &[]));
    assert_eq!(probe.ops("on_request_headers")[0].status(), NOT_FOUND);
}

// --- callouts -------------------------------------------------------------------------------

#[test]
fn a_callout_with_a_negative_timeout_an_unknown_cluster_or_no_path_method_or_authority_is_bad_argument()
 {
    let call = |cluster: &str, headers: serde_json::Value| json!({"op": "http_call", "cluster": cluster, "headers": headers, "timeout_ms": 100});
    let mut probe = Probe::start(json!({"on_request_headers": [
        // The ABI passes the timeout as a 32-bit word; Envoy reads it as a signed int.
        {"op": "http_call", "cluster": "limits", "headers": full_headers(), "timeout_ms": u32::MAX},
        call("nowhere", full_headers()),
        call("limits", json!([[":method", "POST"], [":authority", "limits"]])),
        call("limits", json!([[":path", "/"], [":authority", "limits"]])),
        call("limits", json!([[":path", "/"], [":method", "POST"]])),
        call("limits", full_headers()),
        call("limits", full_headers()),
    ]}));
    let outputs = probe.send(get("/", &[]));
    let ops = probe.ops("on_request_headers");
    let statuses: Vec<u64> = ops.iter().map(Event::status).collect();
    assert_eq!(
        statuses,
        [
            BAD_ARGUMENT,
            BAD_ARGUMENT,
            BAD_ARGUMENT,
            BAD_ARGUMENT,
            BAD_ARGUMENT,
            OK,
            OK
        ]
    );
    assert_eq!(
        (
            ops[5].fields["token"].as_u64(),
            ops[6].fields["token"].as_u64()
        ),
        (Some(4), Some(8)),
        "tokens go up in fours (the low bits are the callout kind)"
    );
    assert_eq!(callouts(&outputs).len(), 2, "only the good ones are sent");
}

#[test]
fn a_callout_answer_reaches_the_root_context_after_the_calling_callback_returns() {
    let mut probe = Probe::start(json!({
        "on_request_headers": [
            {"op": "http_call", "cluster": "limits", "headers": full_headers(), "timeout_ms": 100},
            {"op": "log", "message": "still in the callback"},
        ],
        "on_http_call_response": [
            {"op": "callout_answer"},
            {"op": "header", "map": 7, "name": "grpc-status"},
        ],
        "returns": {"on_request_headers": "pause"},
    }));
    let outputs = probe.send(get("/", &[]));
    let sent = callouts(&outputs);
    assert_eq!(sent.len(), 1);
    assert!(
        probe.ops("on_http_call_response").is_empty(),
        "never during the call"
    );
    assert!(
        outputs
            .iter()
            .any(|o| matches!(o, Output::Paused { context: 2, .. }))
    );
    probe.deliver(sent[0].token, answer(200, "fine"));
    let events = probe.events();
    assert!(
        position(&events, "leave", "on_request_headers")
            < position(&events, "enter", "on_http_call_response")
    );
    let delivery = &events[position(&events, "enter", "on_http_call_response")];
    assert_eq!(delivery.ctx(), 1, "delivered to the root context");
    assert_eq!(delivery.args(), [u64::from(sent[0].token), 2, 4, 0]);
    let read = &probe.ops("on_http_call_response")[0].fields;
    assert_eq!(read["status_header"]["value"]["text"], "200");
    assert_eq!(read["body"]["value"]["text"], "fine");
    assert_eq!(read["trailers"]["pairs"], json!([]), "no trailers came");
    let trailer = &probe.ops("on_http_call_response")[1];
    assert_eq!(
        trailer.status(),
        BAD_ARGUMENT,
        "a trailer map that is not there"
    );
}

#[test]
fn a_callout_answer_arrives_even_after_its_stream_has_ended() {
    let mut probe = Probe::start(json!({
        "on_request_headers": [
            {"op": "http_call", "cluster": "limits", "headers": full_headers(), "timeout_ms": 100},
        ],
        "on_http_call_response": [{"op": "log", "message": "late"}],
    }));
    let outputs = probe.send(get("/", &[]));
    assert_eq!(
        completed_statuses(&outputs),
        [200],
        "the stream did not wait"
    );
    let token = callouts(&outputs)[0].token;
    probe.deliver(token, answer(200, "late"));
    let events = probe.events();
    assert!(
        position(&events, "enter", "on_delete")
            < position(&events, "enter", "on_http_call_response")
    );
}

fn callout(timeout_ms: u32) -> OutgoingCallout {
    OutgoingCallout {
        token: 4,
        cluster: "limits".to_owned(),
        headers: vec![
            (":path".to_owned(), b"/v1/decide".to_vec()),
            (":method".to_owned(), b"POST".to_vec()),
            (":authority".to_owned(), b"limits".to_vec()),
        ],
        body: b"{}".to_vec(),
        timeout_ms,
    }
}

/// What the transport delivers for one callout to `endpoint`.
fn send(endpoint: Endpoint, timeout_ms: u32, runtime: &tokio::runtime::Runtime) -> CalloutReply {
    let transport = Transport::new(HashMap::from([("limits".to_owned(), endpoint)]));
    runtime
        .block_on(transport.send(callout(timeout_ms), None))
        .reply
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

fn status_and_body(reply: &CalloutReply) -> (String, String) {
    (
        reply
            .headers
            .as_ref()
            .and_then(|h| h.get(":status"))
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .unwrap_or_default(),
        reply
            .body
            .as_ref()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default(),
    )
}

/// Delivers `reply` to a probe that made one callout, and returns what it read.
fn delivered_to_the_probe(reply: CalloutReply) -> (Vec<u64>, serde_json::Value) {
    let mut probe = Probe::start(json!({
        "on_request_headers": [
            {"op": "http_call", "cluster": "limits", "headers": full_headers(), "timeout_ms": 100},
        ],
        "on_http_call_response": [{"op": "callout_answer"}, {"op": "status"}],
        "returns": {"on_request_headers": "pause"},
    }));
    let token = callouts(&probe.send(get("/", &[])))[0].token;
    probe.deliver(token, reply);
    let events = probe.events();
    let args = events[position(&events, "enter", "on_http_call_response")].args();
    let ops = probe.ops("on_http_call_response");
    let mut read = ops[0].fields.clone();
    read["get_status"] = ops[1].fields.clone();
    (args, read)
}

#[test]
fn a_callout_that_times_out_arrives_as_a_504_response() {
    let runtime = runtime();
    let addr = runtime.block_on(misbehaving::start(Misbehaviour::Hang));
    let reply = send(Endpoint::Tcp(addr.to_string()), 100, &runtime);
    assert_eq!(
        status_and_body(&reply),
        ("504".to_owned(), "upstream request timeout".to_owned())
    );
    let (_, read) = delivered_to_the_probe(reply);
    assert_eq!(read["status_header"]["value"]["text"], "504");
}

#[test]
fn a_callout_with_no_reachable_host_arrives_as_a_503_response() {
    let runtime = runtime();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let refused = closed.local_addr().unwrap().to_string();
    drop(closed);
    for endpoint in [Endpoint::NoHost, Endpoint::Tcp(refused)] {
        let reply = send(endpoint.clone(), 1000, &runtime);
        let (status, body) = status_and_body(&reply);
        assert_eq!(status, "503", "{endpoint:?}: {body}");
    }
}

#[test]
fn a_callout_reset_arrives_without_headers_and_reading_them_is_bad_argument() {
    let runtime = runtime();
    let addr = runtime.block_on(misbehaving::start(Misbehaviour::ResetMidBody));
    let reply = send(Endpoint::Tcp(addr.to_string()), 1000, &runtime);
    assert!(reply.headers.is_none() && reply.body.is_none(), "{reply:?}");
    let (args, read) = delivered_to_the_probe(reply);
    assert_eq!(args[1], 0, "num_headers is 0");
    assert_eq!(read["status_header"]["status"], BAD_ARGUMENT);
    assert_eq!(read["body"]["status"], NOT_FOUND);
    assert_eq!(read["headers"]["pairs"], json!([]), "pairs of no map: none");
    assert_eq!(read["get_status"]["code"], 11, "BrokenConnection");
    assert_eq!(read["get_status"]["message"]["text"], "reset");
}

#[test]
fn a_callout_answer_over_the_32_mib_response_buffer_limit_arrives_without_headers() {
    let runtime = runtime();
    let limit = sluice_sim::transport::RESPONSE_BUFFER_LIMIT;
    let at_limit = runtime.block_on(misbehaving::start(Misbehaviour::Sized(limit)));
    let reply = send(Endpoint::Tcp(at_limit.to_string()), 10_000, &runtime);
    assert_eq!(
        reply.body.as_ref().map(Vec::len),
        Some(limit),
        "at the limit"
    );
    let over = runtime.block_on(misbehaving::start(Misbehaviour::Sized(limit + 1)));
    let reply = send(Endpoint::Tcp(over.to_string()), 10_000, &runtime);
    assert!(
        reply.headers.is_none() && reply.body.is_none(),
        "one byte over"
    );
    let (args, read) = delivered_to_the_probe(reply);
    assert_eq!((args[1], args[2]), (0, 0), "no headers, no body");
    assert_eq!(read["get_status"]["code"], 11, "BrokenConnection");
}

#[test]
fn the_root_status_stays_broken_connection_after_a_failed_callout_and_says_reset_only_during_it() {
    let mut probe = Probe::start(json!({
        "on_request_headers": [
            {"op": "http_call", "cluster": "limits", "headers": full_headers(), "timeout_ms": 100},
            {"op": "status"},
        ],
        "on_http_call_response": [{"op": "status"}],
        "returns": {"on_request_headers": "pause"},
    }));
    let tokens: Vec<u32> = (0..3)
        .map(|_| callouts(&probe.send(get("/", &[])))[0].token)
        .collect();
    let reset = CalloutReply {
        headers: None,
        body: None,
        trailers: HeaderMap::default(),
    };
    probe.deliver(tokens[0], answer(200, "fine"));
    probe.deliver(tokens[1], reset);
    probe.deliver(tokens[2], answer(200, "fine"));
    let seen: Vec<(u64, String)> = probe
        .ops("on_http_call_response")
        .iter()
        .map(|e| {
            let message = e.fields["message"]["text"].as_str().unwrap_or_default();
            (e.fields["code"].as_u64().unwrap(), message.to_owned())
        })
        .collect();
    assert_eq!(
        seen,
        [
            (0, String::new()),
            (11, "reset".to_owned()),
            (11, String::new())
        ],
        "Envoy's root context keeps the code; a successful callout does not clear it"
    );
    probe.send(get("/", &[]));
    let from_stream = probe.ops("on_request_headers").pop().unwrap();
    assert_eq!(
        (from_stream.op(), &from_stream.fields["code"]),
        ("status", &json!(11)),
        "read from a stream context: the root context's status"
    );
}

// --- local replies, stream control ----------------------------------------------------------

#[test]
fn a_local_reply_passes_through_the_response_header_callback() {
    let mut probe = Probe::start(json!({
        "on_request_headers": [{"op": "local_reply", "status": 429, "body": "slow down",
                                "headers": [["X-Why", "probe"]], "details": "probe denied\tby rule"}],
        "on_response_headers": [{"op": "headers", "map": 2}],
    }));
    let outputs = probe.send(get("/", &[]));
    assert_eq!(completed_statuses(&outputs), [429]);
    assert_eq!(
        completed(&outputs)[0].local_reply.as_deref(),
        Some("probe_denied_by_rule"),
        "Envoy replaces white space in the details"
    );
    let events = probe.events();
    assert!(
        position(&events, "leave", "on_request_headers")
            < position(&events, "enter", "on_response_headers"),
        "the reply takes effect after the callback returns"
    );
    let pairs = probe.ops("on_response_headers")[0].pairs();
    assert!(
        pairs.contains(&(":status".to_owned(), "429".to_owned())),
        "{pairs:?}"
    );
    assert!(
        pairs.contains(&("x-why".to_owned(), "probe".to_owned())),
        "header names lower-cased: {pairs:?}"
    );
}

#[test]
fn a_second_local_reply_from_the_response_path_takes_the_first_ones_place() {
    let mut probe = Probe::start(json!({
        "on_request_headers": [{"op": "local_reply", "status": 429}],
        "on_response_headers": [{"op": "local_reply", "status": 418}],
    }));
    let outputs = probe.send(get("/", &[]));
    assert_eq!(completed_statuses(&outputs), [418], "{outputs:?}");
    assert!(probe.envoy.open_streams().is_empty());
    assert_eq!(
        entered(&probe.events(), 2)
            .iter()
            .filter(|cb| *cb == "on_response_headers")
            .count(),
        1,
        "the response callbacks do not run again"
    );
}

#[test]
fn continue_stream_resumes_a_paused_request_once_the_calling_callback_returns() {
    let mut probe = Probe::start(json!({
        "on_configure": [{"op": "tick", "ms": 10}],
        "on_tick": [
            {"op": "effective_context"},
            {"op": "continue", "kind": 0},
            {"op": "log", "message": "after continue"},
        ],
        "returns": {"on_request_headers": "pause"},
    }));
    let paused = probe.send(get("/", &[]));
    assert!(completed_statuses(&paused).is_empty());
    assert_eq!(probe.envoy.tick_period_ms(0), 10);
    let resumed = probe.envoy.tick(0, START_NS + 10_000_000);
    assert_eq!(completed_statuses(&resumed), [200]);
    let events = probe.events();
    assert!(
        position(&events, "leave", "on_tick") < position(&events, "enter", "on_response_headers")
    );
    assert_eq!(probe.ops("on_tick")[1].status(), OK);
}

#[test]
fn close_stream_resets_the_stream() {
    let mut probe = Probe::start(json!({
        "on_request_headers": [{"op": "close", "kind": 0}],
    }));
    let outputs = probe.send(get("/", &[]));
    let done = completed(&outputs);
    assert_eq!(done.len(), 1);
    assert_ne!(done[0].status, 200, "never reached the upstream");
    assert_eq!(done[0].local_reply.as_deref(), Some("wasm_close_stream"));
    assert!(
        !entered(&probe.events(), 2).contains(&"on_response_headers".to_owned()),
        "a reset stream has no response for the filter"
    );
}

#[test]
fn the_effective_context_selects_the_stream_later_calls_act_on() {
    let mut probe = Probe::start(json!({
        "on_configure": [{"op": "tick", "ms": 5}],
        "on_tick": [
            {"op": "header", "map": 0, "name": ":path"},
            {"op": "effective_context"},
            {"op": "header", "map": 0, "name": ":path"},
            {"op": "effective_context", "context": 99},
        ],
        "returns": {"on_request_headers": "pause"},
    }));
    probe.send(get("/paused", &[]));
    probe.envoy.tick(0, START_NS + 5_000_000);
    let ops = probe.ops("on_tick");
    assert_eq!(
        ops[0].status(),
        BAD_ARGUMENT,
        "the root context has no request"
    );
    assert_eq!((ops[2].status(), ops[2].text()), (OK, "/paused"));
    assert_eq!(ops[3].status(), BAD_ARGUMENT, "an unknown context");
}

// --- shared data, metrics -------------------------------------------------------------------

#[test]
fn shared_data_is_shared_by_every_vm_of_a_vm_id_with_compare_and_swap() {
    let mut probe = Probe::try_start(
        json!({"on_request_headers": [
            {"op": "shared_get", "key": "k"},
            {"op": "shared_set", "key": "k", "value": "from worker 0", "cas": 0, "stream": 1},
            {"op": "shared_set", "key": "k", "value": "stale", "cas": 12345, "stream": 1},
            {"op": "shared_set", "key": "fresh", "value": "any cas will do", "cas": 777, "stream": 1},
        ]}),
        &Setup {
            workers: 2,
            ..Setup::default()
        },
    )
    .unwrap();
    probe.send_to(0, get("/", &[]));
    probe.send_to(1, get("/", &[]));
    let ops = probe.ops("on_request_headers");
    let worker0: Vec<&Event> = ops.iter().filter(|e| e.worker == 0).collect();
    let worker1: Vec<&Event> = ops.iter().filter(|e| e.worker == 1).collect();
    assert_eq!(worker0[0].status(), NOT_FOUND, "absent");
    assert_eq!(worker0[1].status(), OK);
    assert_eq!(
        worker0[2].status(),
        CAS_MISMATCH,
        "the key exists with another CAS"
    );
    assert_eq!(worker0[3].status(), OK, "an absent key accepts any CAS");
    assert_eq!(
        (worker1[0].status(), worker1[0].text()),
        (OK, "from worker 0"),
        "another VM of the vm_id sees it"
    );
    assert!(worker1[0].fields["cas"].as_u64().unwrap() >= 1);
}

#[test]
fn metrics_are_shared_by_the_vms_and_a_counter_never_goes_down() {
    let mut probe = Probe::try_start(
        json!({
            "on_vm_start": [
                {"op": "define_metric", "kind": 0, "name": "probe.requests"},
                {"op": "define_metric", "kind": 1, "name": "probe.level"},
                {"op": "define_metric", "kind": 2, "name": "probe.latency"},
            ],
            "on_request_headers": [
                {"op": "increment_metric", "name": "probe.requests", "by": 1},
                {"op": "increment_metric", "name": "probe.requests", "by": 0},
                {"op": "increment_metric", "name": "probe.requests", "by": -1},
                {"op": "increment_metric", "name": "probe.level", "by": -3},
                {"op": "record_metric", "name": "probe.latency", "value": 7},
                {"op": "get_metric", "name": "probe.requests"},
            ],
        }),
        &Setup {
            workers: 2,
            ..Setup::default()
        },
    )
    .unwrap();
    let ids: Vec<u64> = probe
        .ops("on_vm_start")
        .iter()
        .filter(|e| e.worker == 0)
        .map(|e| e.fields["id"].as_u64().unwrap())
        .collect();
    assert_eq!(
        ids.iter().map(|id| id & 3).collect::<Vec<_>>(),
        [0, 1, 2],
        "the type in the low two bits"
    );
    probe.send_to(0, get("/", &[]));
    probe.send_to(1, get("/", &[]));
    let ops = probe.ops("on_request_headers");
    let statuses: Vec<u64> = ops[..5].iter().map(Event::status).collect();
    assert_eq!(statuses, [OK, BAD_ARGUMENT, BAD_ARGUMENT, OK, OK]);
    assert_eq!(
        ops[11].fields["value"].as_u64(),
        Some(2),
        "worker 1 reads both workers' increments"
    );
    let metrics = probe.envoy.metrics();
    assert_eq!(metrics.number("probe.requests"), Some(2));
    assert_eq!(metrics.number("probe.level"), Some(-6));
}

// --- failure --------------------------------------------------------------------------------

#[test]
fn a_trap_fails_the_vm_and_fail_closed_answers_503_from_then_on() {
    let mut probe = Probe::try_start(
        json!({"on_request_headers": [{"op": "trap", "stream": 1}]}),
        &Setup::default(),
    )
    .unwrap();
    let first = probe.send(get("/", &[]));
    let second = probe.send(get("/", &[]));
    assert_eq!(completed_statuses(&first), [503]);
    assert_eq!(completed_statuses(&second), [503]);
    assert!(probe.envoy.failed(0).is_some());
    assert_eq!(
        completed(&second)[0].local_reply.as_deref(),
        Some("wasm_fail_stream")
    );
    assert!(
        entered(&probe.events(), 3).is_empty(),
        "no callback runs on a failed VM"
    );
}

#[test]
fn a_trap_with_fail_open_fails_its_stream_and_skips_the_filter_from_then_on() {
    let mut probe = Probe::try_start(
        json!({"on_request_headers": [{"op": "trap", "stream": 1}]}),
        &Setup {
            failure_policy: FailurePolicy::FailOpen,
            ..Setup::default()
        },
    )
    .unwrap();
    let first = probe.send(get("/", &[]));
    let second = probe.send(get("/", &[]));
    // The stream whose callback trapped fails all the same (as in Envoy 1.40:
    // in_envoy::fidelity::fail_open_skips_a_trapped_filter_alike).
    assert_eq!(completed_statuses(&first), [503]);
    assert_eq!(completed_statuses(&second), [200]);
    assert!(entered(&probe.events(), 3).is_empty());
}

#[test]
fn fail_reload_gives_a_trapped_worker_a_new_vm_once_the_backoff_has_passed() {
    // Each VM's first stream makes a callout, its second traps.
    let mut probe = Probe::try_start(
        json!({
            "on_request_headers": [
                {"op": "http_call", "cluster": "limits", "headers": full_headers(), "timeout_ms": 100, "stream": 1},
                {"op": "trap", "stream": 2},
            ],
            "on_http_call_response": [{"op": "log", "message": "answered"}],
        }),
        &Setup {
            failure_policy: FailurePolicy::FailReload { backoff_ms: 1000 },
            ..Setup::default()
        },
    )
    .unwrap();
    let mut statuses = Vec::new();
    let mut send_at = |probe: &mut Probe, after_start_ms: u64| {
        probe.now_ns = START_NS + after_start_ms * 1_000_000;
        let outputs = probe.send(get("/", &[]));
        statuses.extend(completed_statuses(&outputs));
        outputs
    };
    let first = send_at(&mut probe, 0);
    let old_token = callouts(&first)[0].token;
    send_at(&mut probe, 0); // traps
    send_at(&mut probe, 500); // within the backoff from the load at start-up
    let reloaded = send_at(&mut probe, 1000); // a new VM: its first stream
    send_at(&mut probe, 1000); // its second stream traps
    send_at(&mut probe, 1999); // within the backoff from the reload
    send_at(&mut probe, 2000); // and a third VM
    assert_eq!(statuses, [200, 503, 503, 200, 503, 503, 200]);
    assert_eq!(
        probe.envoy.reloads(),
        sluice_host::envoy::Reloads {
            backoff: 2,
            success: 2,
            failure: 0
        }
    );
    let starts = probe
        .events()
        .iter()
        .filter(|e| e.worker == 0 && e.kind() == "enter" && e.cb() == "on_vm_start")
        .count();
    assert_eq!(starts, 3, "start-up ran again in each new VM");

    // The first VM's callout is answered after it was replaced: Envoy drops the answer with
    // the VM, and the new VM never sees a token it did not issue.
    let new_token = callouts(&reloaded)[0].token;
    assert!(new_token > old_token, "tokens go on across reloads");
    let before = probe.events().len();
    assert!(probe.deliver(old_token, answer(200, "late")).is_empty());
    assert_eq!(
        probe.events().len(),
        before,
        "nothing ran for the old answer"
    );
    assert!(probe.envoy.failed(0).is_none());
}

#[test]
fn ticks_set_at_start_up_fire_every_period_while_there_is_traffic() {
    let probe = Probe::start(json!({
        "on_configure": [{"op": "tick", "ms": 250}],
        "on_tick": [{"op": "time"}],
    }));
    let start_ms = (START_NS / 1_000_000) as i64;
    let records = [
        sluice_e2e::request(start_ms, "203.0.113.9", "/"),
        sluice_e2e::request(start_ms + 1000, "203.0.113.9", "/"),
    ];
    let runtime = runtime();
    let dispatcher = Dispatcher::new(
        Arc::new(Transport::new(HashMap::new())),
        runtime.handle().clone(),
    );
    let mut collected = sluice_e2e::Collected::default();
    let (stats, envoys, _) =
        Replay::new(vec![probe.envoy], dispatcher, &runtime, &records).run(&mut collected);
    assert_eq!(stats.requests, 2);
    let ticks: Vec<u64> = envoys[0]
        .logs()
        .recent()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l.message).ok())
        .filter(|e| e["cb"] == "on_tick" && e["op"] == "time")
        .map(|e| e["ns"].as_u64().unwrap())
        .collect();
    assert_eq!(
        ticks,
        [1, 2, 3, 4].map(|n| START_NS + n * 250_000_000),
        "every 250 ms of virtual time from start-up, until the traffic ends"
    );
}

#[test]
fn a_log_level_above_critical_is_bad_argument() {
    let mut probe = Probe::start(json!({"on_request_headers": [
        {"op": "log_at", "level": 5, "message": "critical"},
        {"op": "log_at", "level": 6, "message": "above every level"}
    ]}));
    let outputs = probe.send(get("/", &[]));
    assert_eq!(completed_statuses(&outputs), [200], "the stream goes on");
    let statuses: Vec<u64> = probe
        .ops("on_request_headers")
        .iter()
        .map(Event::status)
        .collect();
    assert_eq!(statuses, [0, BAD_ARGUMENT]);
}

// --- the table ------------------------------------------------------------------------------

/// The file a test reference in docs/fidelity.md points to: `name` is in this file,
/// `host_loading.rs::name` in another e2e test file, `host/src/<file>.rs::name` in the host crate
/// (`simulator/src/...` in the simulator's), `in_envoy::x::name` among the real-Envoy tests.
fn test_source(reference: &str) -> (std::path::PathBuf, &str) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    match reference.rsplit_once("::") {
        Some((file, name)) if file.starts_with("host/") || file.starts_with("simulator/") => {
            (root.join("..").join(file), name)
        }
        Some((module, name)) if module.starts_with("in_envoy::") => (
            root.join("e2e/in_envoy")
                .join(module.trim_start_matches("in_envoy::"))
                .with_extension("rs"),
            name,
        ),
        Some((file, name)) => (root.join("e2e").join(file), name),
        None => (root.join("e2e/fidelity.rs"), reference),
    }
}

/// The references in backticks at the start of `cell`, before its prose (which starts at a
/// '.' or ':' outside backticks).
fn references(cell: &str) -> Vec<&str> {
    let mut inside = false;
    let end = cell
        .char_indices()
        .find(|&(_, c)| {
            inside ^= c == '`';
            !inside && (c == '.' || c == ':')
        })
        .map_or(cell.len(), |(i, _)| i);
    cell[..end].split('`').skip(1).step_by(2).collect()
}

/// Every `fn name(` after `#[test]` in `file`.
fn tests_in(file: &std::path::Path) -> Vec<String> {
    let source = std::fs::read_to_string(file).unwrap();
    source
        .split("#[test]\nfn ")
        .skip(1)
        .filter_map(|rest| rest.split('(').next())
        .map(str::to_owned)
        .collect()
}

fn assert_exists(reference: &str, named: &mut BTreeSet<String>) {
    let (file, name) = test_source(reference);
    let source = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("{reference}: {}: {e}", file.display()));
    assert!(
        source.contains(&format!("fn {name}(")),
        "{reference}: no such test in {}",
        file.display()
    );
    named.insert(name.to_owned());
}

#[test]
fn every_row_of_the_fidelity_table_names_a_test_that_exists_or_states_a_difference() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let table = std::fs::read_to_string(root.join("../docs/fidelity.md")).unwrap();
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| Behaviour"))
        .collect();
    assert!(rows.len() >= 40, "{} rows", rows.len());
    let mut named = BTreeSet::new();
    for row in rows {
        // Behaviour, Envoy, Simulator, Test, Envoy 1.40.
        let cells: Vec<&str> = row.trim_end_matches('|').split(" | ").collect();
        let [.., test_cell, envoy_cell] = cells.as_slice() else {
            panic!("a row without its cells: {row}");
        };
        let tests = references(test_cell);
        assert!(
            !tests.is_empty() || row.contains("**Difference**"),
            "a row with neither a test nor a stated difference: {row}"
        );
        for reference in tests {
            assert_exists(reference, &mut named);
        }
        // A real Envoy's verdict names the in_envoy test that gave it, or says there is none
        // yet.
        let verdicts: Vec<&str> = envoy_cell
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|r| r.starts_with("in_envoy::"))
            .collect();
        assert!(
            !verdicts.is_empty() || envoy_cell.trim() == "not yet run in Envoy",
            "a row whose real-Envoy verdict names no in_envoy test: {row}"
        );
        for reference in verdicts {
            assert_exists(reference, &mut named);
        }
    }
    for file in [
        root.join("e2e/fidelity.rs"),
        root.join("e2e/in_envoy/fidelity.rs"),
    ] {
        for test in tests_in(&file) {
            assert!(
                named.contains(&test) || test.starts_with("every_row_of_the_fidelity_table"),
                "{test} ({}) is in no row of docs/fidelity.md",
                file.display()
            );
        }
    }
}
