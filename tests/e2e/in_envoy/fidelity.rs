//! The simulator held against a real Envoy: the probe filter (`tests/probe`) runs the same
//! script on the same request in Envoy 1.40 and in `sluice-sim`, and what it observed is
//! compared field by field. Each test here is the real-Envoy verdict of rows in
//! `docs/fidelity.md`.

use serde_json::{Value, json};
use sluice_e2e::probe::{CANARY, Event, Probe, Setup, get as sim_get};
use sluice_e2e::real_envoy::{Backends, EnvoyProbe, Plugin, eventually};
use sluice_harness::http;
use std::time::Duration;

/// The probe in both hosts, one worker each, running `script`; each sent one GET of `path`
/// with `headers`. The events of both, once the real stream has ended.
fn both(script: &Value, path: &str, headers: &[(&str, &str)]) -> (Vec<Event>, Vec<Event>) {
    let backends = Backends::start(&[]);
    let real = EnvoyProbe::start(
        &Plugin::probe(&script.to_string()),
        1,
        backends.server_addr(),
        backends.upstream.addr(),
    )
    .expect("Envoy starts with the probe");
    let ingress = real.envoy.listener("ingress").expect("ingress");
    let mut with_host = vec![("host", "shop.example")];
    with_host.extend_from_slice(headers);
    http::get(ingress, path, &with_host).expect("an answer");
    eventually("the stream's on_delete", Duration::from_secs(5), || {
        real.events().iter().any(|e| e.cb() == "on_delete")
    });
    let mut simulated = Probe::try_start(script.clone(), &Setup::default()).expect("the probe");
    simulated.send(sim_get(path, headers));
    (real.events(), simulated.events())
}

/// `(callback, context)` of each callback entered, per VM (the canary first).
fn entered(events: &[Event]) -> Vec<(usize, String, u64, Vec<u64>)> {
    events
        .iter()
        .filter(|e| e.kind() == "enter")
        .map(|e| (e.worker, e.cb().to_owned(), e.ctx(), e.args()))
        .collect()
}

/// The `op` events of callback `cb`, as (op, status).
fn ops(events: &[Event], cb: &str) -> Vec<(String, u64)> {
    events
        .iter()
        .filter(|e| e.kind() == "op" && e.cb() == cb)
        .map(|e| (e.op().to_owned(), e.status()))
        .collect()
}

fn op_event<'a>(events: &'a [Event], cb: &str, nth: usize) -> &'a Event {
    events
        .iter()
        .filter(|e| e.kind() == "op" && e.cb() == cb)
        .nth(nth)
        .unwrap_or_else(|| panic!("no op {nth} in {cb}: {events:#?}"))
}

#[test]
fn start_up_and_a_streams_callbacks_come_in_the_same_order() {
    let (real, simulated) = both(&json!({}), "/", &[]);
    let (real, simulated) = (entered(&real), entered(&simulated));
    // Start-up: the canary, then the worker's VM, each _initialize'd, with root context 1.
    let start_up = |entered: &[(usize, String, u64, Vec<u64>)], worker: usize| {
        entered
            .iter()
            .filter(|(w, cb, ..)| {
                *w == worker
                    && ["on_context_create", "on_vm_start", "on_configure"].contains(&cb.as_str())
            })
            .take(3)
            .map(|(_, cb, ctx, args)| (cb.clone(), *ctx, args.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        start_up(&real, CANARY),
        start_up(&simulated, CANARY),
        "the canary's start-up"
    );
    assert_eq!(
        start_up(&real, 0),
        start_up(&simulated, 0),
        "the worker's start-up"
    );
    // The stream: its callbacks in order, on the worker.
    let stream = |entered: &[(usize, String, u64, Vec<u64>)]| {
        entered
            .iter()
            .filter(|(w, _, ctx, _)| *w == 0 && *ctx == 2)
            .map(|(_, cb, ..)| cb.clone())
            .filter(|cb| cb != "on_response_body")
            .collect::<Vec<_>>()
    };
    assert_eq!(stream(&real), stream(&simulated), "the stream's callbacks");
    assert_eq!(
        stream(&real),
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
fn request_headers_carry_the_same_pseudo_headers_lower_cased() {
    let script = json!({"on_request_headers": [
        {"op": "headers", "map": 0},
        {"op": "header", "map": 0, "name": "X-Mixed-Case"},
        {"op": "header_size", "map": 0},
        {"op": "headers", "map": 1}
    ]});
    let (real, simulated) = both(&script, "/a/b?q=1", &[("X-Mixed-Case", "v")]);
    assert_eq!(
        ops(&real, "on_request_headers"),
        ops(&simulated, "on_request_headers")
    );
    let names = |events: &[Event]| -> Vec<String> {
        op_event(events, "on_request_headers", 0)
            .pairs()
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    };
    let (real_names, simulated_names) = (names(&real), names(&simulated));
    assert_eq!(
        real_names[..4],
        [":authority", ":path", ":method", ":scheme"]
    );
    assert_eq!(real_names[..4], simulated_names[..4]);
    assert!(real_names.contains(&"x-mixed-case".to_owned()));
    assert!(simulated_names.contains(&"x-mixed-case".to_owned()));
    assert_eq!(op_event(&real, "on_request_headers", 1).text(), "v");
    assert_eq!(op_event(&simulated, "on_request_headers", 1).text(), "v");
}

#[test]
fn properties_are_encoded_alike() {
    let paths: &[&[&str]] = &[
        &["source", "address"],
        &["source", "port"],
        &["request", "time"],
        &["request", "path"],
        &["request", "url_path"],
        &["request", "method"],
        &["request", "host"],
        &["request", "query"],
        &["plugin_name"],
        &["plugin_root_id"],
        &["plugin_vm_id"],
        &["no", "such", "property"],
    ];
    let steps: Vec<Value> = paths
        .iter()
        .map(|path| json!({"op": "property", "path": path}))
        .collect();
    let (real, simulated) = both(&json!({"on_request_headers": steps}), "/a/b?q=1", &[]);
    assert_eq!(
        ops(&real, "on_request_headers"),
        ops(&simulated, "on_request_headers"),
        "the same statuses"
    );
    for (i, path) in paths.iter().enumerate() {
        let (r, s) = (
            op_event(&real, "on_request_headers", i),
            op_event(&simulated, "on_request_headers", i),
        );
        let name = path.join(".");
        match name.as_str() {
            // The peer differs (127.0.0.1 against the simulator's 203.0.113.9): the form is
            // the same, ip:port and an 8-byte little-endian integer.
            "source.address" => {
                for e in [r, s] {
                    let (ip, port) = e.text().rsplit_once(':').expect("ip:port");
                    assert!(
                        ip.parse::<std::net::IpAddr>().is_ok(),
                        "{name}: {}",
                        e.text()
                    );
                    assert!(port.parse::<u16>().is_ok(), "{name}: {}", e.text());
                }
            }
            "source.port" | "request.time" => {
                assert_eq!(r.raw().len(), 8, "{name}");
                assert_eq!(s.raw().len(), 8, "{name}");
            }
            _ => assert_eq!(
                r.raw(),
                s.raw(),
                "{name}: {} against {}",
                r.text(),
                s.text()
            ),
        }
    }
}

#[test]
fn callout_arguments_are_refused_alike() {
    let full = json!([[":path", "/"], [":method", "GET"], [":authority", "limits"]]);
    let script = json!({"on_request_headers": [
        {"op": "http_call", "cluster": "nowhere", "headers": full, "timeout_ms": 100},
        {"op": "http_call", "cluster": "limits", "headers": [[":method", "GET"], [":authority", "limits"]], "timeout_ms": 100},
        {"op": "http_call", "cluster": "limits", "headers": [[":path", "/"], [":authority", "limits"]], "timeout_ms": 100},
        {"op": "http_call", "cluster": "limits", "headers": [[":path", "/"], [":method", "GET"]], "timeout_ms": 100},
        {"op": "http_call", "cluster": "limits", "headers": full, "timeout_ms": 100}
    ]});
    let (real, simulated) = both(&script, "/", &[]);
    assert_eq!(
        ops(&real, "on_request_headers"),
        ops(&simulated, "on_request_headers")
    );
    let statuses: Vec<u64> = ops(&real, "on_request_headers")
        .iter()
        .map(|(_, s)| *s)
        .collect();
    assert_eq!(
        statuses,
        [2, 2, 2, 2, 0],
        "BadArgument for each missing part, then Ok"
    );
    let token =
        |events: &[Event]| op_event(events, "on_request_headers", 4).fields["token"].clone();
    assert_eq!(token(&real), token(&simulated), "the first token");
}
