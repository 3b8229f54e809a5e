//! The simulator held against a real Envoy: the probe filter (`tests/probe`) runs the same
//! script on the same requests in Envoy 1.40 and in `sluice-sim`, and what it observed is
//! compared field by field. Each test here is the real-Envoy verdict of rows in
//! `docs/fidelity.md`.
//!
//! Both hosts get one worker. Both hosts' callouts (cluster `limits`) reach the same server,
//! Envoy's through Envoy, the simulator's through its own transport: the test upstream (200
//! and [`UPSTREAM_BODY`]) unless a test names a misbehaving one.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use sluice_e2e::misbehaving::{self, Misbehaviour};
use sluice_e2e::probe::{CANARY, Event, Probe, Setup, callouts, completed, get as sim_get};
use sluice_e2e::real_envoy::{Backends, EnvoyProbe, Plugin, eventually};
use sluice_harness::{Envoy, UPSTREAM_BODY, http};
use sluice_host::envoy::{FailurePolicy, Request};
use sluice_sim::connect::Endpoint;
use sluice_sim::transport::Transport;

/// proxy-wasm's status codes.
const OK: u64 = 0;
const NOT_FOUND: u64 = 1;
const BAD_ARGUMENT: u64 = 2;

/// The probe running one script in both hosts.
struct Both {
    real: EnvoyProbe,
    simulated: Probe,
    /// Carries the simulator's callouts to the server Envoy's go to.
    transport: Transport,
    /// Statuses the real client got, in order (0: no answer, the connection closed).
    real_statuses: Vec<u16>,
    /// Statuses of the streams the simulator completed, in order.
    simulated_statuses: Vec<u16>,
    sent: usize,
    backends: Backends,
}

impl Both {
    fn start(script: &Value) -> Both {
        Both::start_with(script, "FAIL_CLOSED", FailurePolicy::FailClosed, None)
    }

    /// Both hosts on `script`, with these failure policies, their callouts (cluster `limits`)
    /// going to `callout_target` (the test upstream if `None`).
    fn start_with(
        script: &Value,
        real_policy: &str,
        simulated_policy: FailurePolicy,
        callout_target: Option<SocketAddr>,
    ) -> Both {
        let backends = Backends::start(&[]);
        let target = callout_target.unwrap_or_else(|| backends.upstream.addr());
        let real = EnvoyProbe::start(
            &Plugin::probe(&script.to_string()).failing(real_policy),
            1,
            target,
            backends.upstream.addr(),
        )
        .expect("Envoy starts with the probe");
        let simulated = Probe::try_start(
            script.clone(),
            &Setup {
                failure_policy: simulated_policy,
                ..Setup::default()
            },
        )
        .expect("the simulator starts the probe");
        let transport = Transport::new(HashMap::from([(
            "limits".to_owned(),
            Endpoint::Tcp(target.to_string()),
        )]));
        Both {
            real,
            simulated,
            transport,
            real_statuses: Vec::new(),
            simulated_statuses: Vec::new(),
            sent: 0,
            backends,
        }
    }

    /// Sends a GET of `path` with `headers` (and `host: shop.example`) to both, and waits
    /// until Envoy has ended the stream and answered its callouts.
    fn send(&mut self, path: &str, headers: &[(&str, &str)]) {
        self.send_real(path, headers);
        let sent = self.sent;
        eventually("the stream's on_delete", Duration::from_secs(5), || {
            let events = self.real.events();
            let deleted = events
                .iter()
                .filter(|e| e.kind() == "enter" && e.cb() == "on_delete");
            let asked = events
                .iter()
                .filter(|e| e.op() == "http_call" && e.status() == OK)
                .count();
            let answered = events
                .iter()
                .filter(|e| e.kind() == "enter" && e.cb() == "on_http_call_response")
                .count();
            deleted.count() >= sent && answered >= asked
        });
        self.send_simulated(path, headers);
    }

    /// Sends a GET of `path` to both without waiting for callbacks (for a VM that runs none).
    fn send_without_waiting(&mut self, path: &str) {
        self.send_real(path, &[]);
        self.send_simulated(path, &[]);
    }

    fn send_real(&mut self, path: &str, headers: &[(&str, &str)]) {
        let ingress = self.real.envoy.listener("ingress").expect("ingress");
        let mut with_host = vec![("host", "shop.example")];
        with_host.extend_from_slice(headers);
        let status = http::get(ingress, path, &with_host).map_or(0, |a| a.status);
        self.real_statuses.push(status);
        self.sent += 1;
    }

    /// Sends to the simulator, and carries its callouts by its own transport until none is
    /// left.
    pub fn send_simulated(&mut self, path: &str, headers: &[(&str, &str)]) {
        let mut outputs = self.simulated.send(simulated_get(path, headers));
        loop {
            self.simulated_statuses
                .extend(completed(&outputs).iter().map(|d| d.status));
            let asked = callouts(&outputs);
            if asked.is_empty() {
                return;
            }
            outputs = asked
                .into_iter()
                .flat_map(|c| {
                    let reply = self
                        .backends
                        .runtime
                        .block_on(self.transport.send(c.clone(), None))
                        .reply;
                    self.simulated.deliver(c.token, reply)
                })
                .collect();
        }
    }

    fn events(&self) -> (Vec<Event>, Vec<Event>) {
        (self.real.events(), self.simulated.events())
    }
}

/// A GET as [`Both::send`] sends it to Envoy: the simulator probe tests' request, over plain
/// HTTP, its upstream answering the test upstream's body.
fn simulated_get(path: &str, headers: &[(&str, &str)]) -> Request {
    let mut request = sim_get(path, headers);
    for (name, value) in &mut request.headers {
        if name == ":scheme" {
            *value = b"http".to_vec();
        }
    }
    request.upstream_bytes = UPSTREAM_BODY.len() as u64;
    request
}

/// The probe in both hosts, running `script`; each sent one GET of `path` with `headers`.
fn both(script: &Value, path: &str, headers: &[(&str, &str)]) -> (Vec<Event>, Vec<Event>) {
    let mut both = Both::start(script);
    both.send(path, headers);
    both.events()
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

/// The `op` events of callback `cb`, each as its fields less those that name a context or
/// carry values that differ between the hosts by setup (tokens, CAS values, times).
fn op_fields(events: &[Event], cb: &str) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e.kind() == "op" && e.cb() == cb)
        .map(|e| {
            let mut fields = e.fields.clone();
            if let Value::Object(map) = &mut fields {
                for volatile in ["ctx", "cas", "ns", "token", "id"] {
                    map.remove(volatile);
                }
            }
            fields
        })
        .collect()
}

#[test]
fn initialize_runs_first_in_every_vm() {
    let (real, simulated) = both(&json!({}), "/", &[]);
    for (host, events) in [("Envoy", &real), ("simulator", &simulated)] {
        for worker in [CANARY, 0] {
            let first = events
                .iter()
                .find(|e| e.worker == worker)
                .unwrap_or_else(|| panic!("{host}: no event from VM {worker}"));
            assert_eq!(first.kind(), "initialize", "{host}, VM {worker}: {first:?}");
        }
    }
}

#[test]
fn on_configure_answering_false_rejects_the_configuration() {
    let script = json!({"returns": {"on_configure": false}});
    let backends = Backends::start(&[]);
    let real = EnvoyProbe::start(
        &Plugin::probe(&script.to_string()),
        1,
        backends.upstream.addr(),
        backends.upstream.addr(),
    );
    let Err(refusal) = real else {
        panic!("Envoy took a configuration on_configure refused");
    };
    assert!(
        refusal
            .to_string()
            .contains("Unable to create Wasm HTTP filter")
            || refusal.to_string().contains("Failed to configure"),
        "{refusal}"
    );
    assert!(Probe::try_start(script, &Setup::default()).is_err());
}

#[test]
fn the_plugin_configuration_is_readable_only_during_on_configure() {
    let script = json!({
        "on_configure": [{"op": "buffer", "kind": 7}, {"op": "buffer", "kind": 6}],
        "on_request_headers": [{"op": "buffer", "kind": 7}, {"op": "buffer", "kind": 6}]
    });
    let (real, simulated) = both(&script, "/", &[]);
    for cb in ["on_configure", "on_request_headers"] {
        assert_eq!(ops(&real, cb), ops(&simulated, cb), "{cb}");
    }
    assert!(
        ops(&real, "on_configure")
            .iter()
            .all(|(_, status)| *status == OK)
    );
    assert_eq!(
        ops(&real, "on_request_headers"),
        [("buffer".to_owned(), NOT_FOUND), ("buffer".to_owned(), OK)]
    );
}

#[test]
fn a_header_read_returns_the_first_value_and_the_pairs_every_value() {
    let script = json!({"on_request_headers": [
        {"op": "header", "map": 0, "name": "x-dup"},
        {"op": "headers", "map": 0}
    ]});
    let mut both = Both::start(&script);
    both.send("/", &[("x-dup", "one"), ("x-dup", "two")]);
    let (real, simulated) = both.events();
    for (host, events) in [("Envoy", &real), ("simulator", &simulated)] {
        assert_eq!(
            op_event(events, "on_request_headers", 0).text(),
            "one",
            "{host}"
        );
        let values: Vec<String> = op_event(events, "on_request_headers", 1)
            .pairs()
            .into_iter()
            .filter(|(k, _)| k == "x-dup")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(values, ["one", "two"], "{host}");
    }
}

#[test]
fn in_on_log_the_request_map_is_not_found_and_has_no_size() {
    let script = json!({
        "on_log": [{"op": "header", "map": 0, "name": ":path"}, {"op": "header_size", "map": 0},
                   {"op": "header", "map": 2, "name": ":status"}],
        "on_response_headers": [{"op": "header", "map": 2, "name": ":status"}, {"op": "header", "map": 0, "name": ":path"}]
    });
    let (real, simulated) = both(&script, "/", &[]);
    for cb in ["on_log", "on_response_headers"] {
        assert_eq!(op_fields(&real, cb), op_fields(&simulated, cb), "{cb}");
    }
    assert_eq!(op_event(&real, "on_response_headers", 0).text(), "200");
}

#[test]
fn the_other_stream_properties_are_encoded_alike() {
    // Those whose values depend on the connection are compared by form: addresses, ids.
    let same: &[&[&str]] = &[
        &["request", "scheme"],
        &["request", "referer"],
        &["request", "useragent"],
        &["request", "protocol"],
        &["request", "headers", "x-probe"],
        &["plugin_vm_id"],
    ];
    let by_form: &[&[&str]] = &[
        &["destination", "address"],
        &["destination", "port"],
        &["connection_id"],
    ];
    let steps: Vec<Value> = same
        .iter()
        .chain(by_form)
        .map(|path| json!({"op": "property", "path": path}))
        .collect();
    let script = json!({"on_request_headers": steps});
    let headers = [
        ("referer", "https://shop.example/"),
        ("user-agent", "probe/1"),
        ("x-probe", "yes"),
    ];
    let (real, simulated) = both(&script, "/", &headers);
    assert_eq!(
        ops(&real, "on_request_headers"),
        ops(&simulated, "on_request_headers"),
        "the same statuses: {:#?}",
        op_fields(&real, "on_request_headers")
    );
    for (i, path) in same.iter().enumerate() {
        let (r, s) = (
            op_event(&real, "on_request_headers", i),
            op_event(&simulated, "on_request_headers", i),
        );
        assert_eq!(
            r.raw(),
            s.raw(),
            "{}: {} against {}",
            path.join("."),
            r.text(),
            s.text()
        );
    }
    for (i, path) in by_form.iter().enumerate() {
        let i = same.len() + i;
        let (r, s) = (
            op_event(&real, "on_request_headers", i),
            op_event(&simulated, "on_request_headers", i),
        );
        let name = path.join(".");
        match name.as_str() {
            "destination.port" | "connection_id" => {
                assert_eq!((r.raw().len(), s.raw().len()), (8, 8), "{name}");
            }
            "destination.address" => {
                for e in [r, s] {
                    let (ip, _) = e.text().rsplit_once(':').expect("ip:port");
                    assert!(ip.parse::<IpAddr>().is_ok(), "{name}: {}", e.text());
                }
            }
            _ => assert_eq!(r.text(), s.text(), "{name}"),
        }
    }
}

#[test]
fn request_id_is_envoys_own_for_an_external_request() {
    // With use_remote_address, Envoy takes the client for external and puts its own UUID in
    // x-request-id (preserve_external_request_id is off by default); the simulator keeps the
    // one the trace logged. A difference, stated in docs/fidelity.md.
    let script = json!({"on_request_headers": [
        {"op": "property", "path": ["request", "id"]},
        {"op": "header", "map": 0, "name": "x-request-id"}
    ]});
    let (real, simulated) = both(&script, "/", &[("x-request-id", "req-1")]);
    let real_id = op_event(&real, "on_request_headers", 0).text().to_owned();
    assert_ne!(real_id, "req-1");
    assert_eq!(real_id.len(), 36, "a UUID: {real_id}");
    assert_eq!(op_event(&real, "on_request_headers", 1).text(), real_id);
    assert_eq!(
        op_event(&simulated, "on_request_headers", 0).text(),
        "req-1"
    );
}

#[test]
fn start_up_runs_twice_on_the_main_thread_then_in_each_worker() {
    let script = json!({});
    let backends = Backends::start(&[]);
    let real = EnvoyProbe::start(
        &Plugin::probe(&script.to_string()),
        2,
        backends.upstream.addr(),
        backends.upstream.addr(),
    )
    .expect("Envoy starts with the probe");
    let simulated = Probe::try_start(
        script,
        &Setup {
            workers: 2,
            ..Setup::default()
        },
    )
    .expect("the probe");
    // Per VM label: how many VMs were initialized, and how many started.
    let counts = |events: &[Event]| {
        let mut counts = std::collections::BTreeMap::<usize, (usize, usize)>::new();
        for e in events {
            let entry = counts.entry(e.worker).or_default();
            match (e.kind(), e.cb()) {
                ("initialize", _) => entry.0 += 1,
                ("enter", "on_configure") => entry.1 += 1,
                _ => {}
            }
        }
        counts
    };
    eventually("both workers started", Duration::from_secs(5), || {
        counts(&real.events()).len() == 3
    });
    let expected = std::collections::BTreeMap::from([(0, (1, 1)), (1, (1, 1)), (CANARY, (3, 2))]);
    assert_eq!(counts(&real.events()), expected, "Envoy");
    assert_eq!(counts(&simulated.events()), expected, "the simulator");
}

#[test]
fn a_property_set_is_read_back_by_its_name() {
    let script = json!({"on_request_headers": [
        {"op": "set_property", "path": "wasm.probe_mark", "value": "marked"},
        {"op": "property", "path": ["wasm.probe_mark"]}
    ]});
    let (real, simulated) = both(&script, "/", &[]);
    assert_eq!(
        op_fields(&real, "on_request_headers"),
        op_fields(&simulated, "on_request_headers")
    );
    assert_eq!(op_event(&real, "on_request_headers", 1).text(), "marked");
}

#[test]
fn done_and_an_unknown_effective_context_are_refused_alike() {
    let script = json!({"on_request_headers": [
        {"op": "done"},
        {"op": "effective_context", "context": 999},
        {"op": "status"}
    ]});
    let (real, simulated) = both(&script, "/", &[]);
    assert_eq!(
        op_fields(&real, "on_request_headers"),
        op_fields(&simulated, "on_request_headers")
    );
    assert_eq!(
        ops(&real, "on_request_headers")[..2],
        [
            ("done".to_owned(), NOT_FOUND),
            ("effective_context".to_owned(), BAD_ARGUMENT)
        ]
    );
}

#[test]
fn a_paused_request_resumed_from_its_callouts_answer_goes_on_alike() {
    let script = json!({
        "on_request_headers": [
            {"op": "http_call", "cluster": "limits", "headers": [[":path", "/"], [":method", "GET"], [":authority", "limits"]], "timeout_ms": 1000},
            {"op": "log", "message": "still in the callback"}
        ],
        "on_http_call_response": [
            {"op": "callout_answer"},
            {"op": "header", "map": 7, "name": "grpc-status"},
            {"op": "effective_context"},
            {"op": "header", "map": 0, "name": ":path"},
            {"op": "continue", "kind": 0},
            {"op": "header", "map": 0, "name": ":path"}
        ],
        "returns": {"on_request_headers": "pause"}
    });
    let mut both = Both::start(&script);
    both.send("/", &[]);
    let (real, simulated) = both.events();
    assert_eq!(
        both.real_statuses,
        [200],
        "resumed, it reached the upstream"
    );
    assert_eq!(both.simulated_statuses, [200]);
    // The answer comes to the root context, after the calling callback returned.
    for (host, events) in [("Envoy", &real), ("simulator", &simulated)] {
        let at = |kind: &str, cb: &str| {
            events
                .iter()
                .position(|e| e.kind() == kind && e.cb() == cb)
                .unwrap_or_else(|| panic!("{host}: no {kind} {cb}"))
        };
        assert!(
            at("leave", "on_request_headers") < at("enter", "on_http_call_response"),
            "{host}"
        );
        let delivery = &events[at("enter", "on_http_call_response")];
        assert_eq!(delivery.ctx(), 1, "{host}: to the root context");
    }
    let answer = |events: &[Event]| {
        let read = op_event(events, "on_http_call_response", 0).fields.clone();
        (
            read["status_header"]["value"]["text"].clone(),
            read["body"]["value"]["text"].clone(),
            read["trailers"].clone(),
        )
    };
    assert_eq!(answer(&real), answer(&simulated));
    assert_eq!(answer(&real).1, UPSTREAM_BODY);
    // Trailers that never came, the context set, the stream resumed, its headers gone.
    assert_eq!(
        ops(&real, "on_http_call_response")[1..],
        ops(&simulated, "on_http_call_response")[1..]
    );
    assert_eq!(
        ops(&real, "on_http_call_response")[1..],
        [
            ("header".to_owned(), BAD_ARGUMENT),
            ("effective_context".to_owned(), OK),
            ("header".to_owned(), OK),
            ("continue".to_owned(), OK),
            ("header".to_owned(), BAD_ARGUMENT)
        ],
        "trailers that never came; the request headers there until continue_stream, gone at once after it"
    );
    let args = |events: &[Event]| {
        events
            .iter()
            .find(|e| e.kind() == "enter" && e.cb() == "on_http_call_response")
            .map(|e| e.args()[1..].to_vec())
    };
    // The numbers of headers differ (Envoy's answer carries more); the body and trailers not.
    assert_eq!(
        args(&real).map(|a| a[1..].to_vec()),
        args(&simulated).map(|a| a[1..].to_vec())
    );
}

#[test]
fn a_callouts_answer_arrives_even_after_its_stream_has_ended() {
    let script = json!({
        "on_request_headers": [
            {"op": "http_call", "cluster": "limits", "headers": [[":path", "/"], [":method", "GET"], [":authority", "limits"]], "timeout_ms": 1000}
        ],
        "on_http_call_response": [{"op": "log", "message": "late"}]
    });
    let mut both = Both::start(&script);
    both.send("/", &[]);
    let (real, simulated) = both.events();
    for (host, events) in [("Envoy", &real), ("simulator", &simulated)] {
        let delete = events
            .iter()
            .position(|e| e.kind() == "enter" && e.cb() == "on_delete");
        let answer = events
            .iter()
            .position(|e| e.kind() == "enter" && e.cb() == "on_http_call_response");
        assert!(answer.is_some(), "{host}: the answer came");
        assert!(delete.is_some(), "{host}: the stream ended");
    }
    assert_eq!(both.real_statuses, [200]);
    assert_eq!(both.simulated_statuses, [200]);
}

#[test]
fn a_local_reply_goes_back_through_the_response_header_callback() {
    let script = json!({
        "on_request_headers": [
            {"op": "local_reply", "status": 403, "body": "no\n", "headers": [["X-Reason", "probe"]], "details": "probe said no"}
        ],
        "on_response_headers": [
            {"op": "header", "map": 2, "name": ":status"},
            {"op": "header", "map": 2, "name": "x-reason"}
        ],
        "returns": {"on_request_headers": "pause"}
    });
    let mut both = Both::start(&script);
    both.send("/", &[]);
    let (real, simulated) = both.events();
    assert_eq!(both.real_statuses, [403]);
    assert_eq!(both.simulated_statuses, [403]);
    assert_eq!(
        op_fields(&real, "on_response_headers"),
        op_fields(&simulated, "on_response_headers")
    );
    assert_eq!(op_event(&real, "on_response_headers", 1).text(), "probe");
}

#[test]
fn shared_data_compare_and_swap_answers_alike() {
    let script = json!({"on_request_headers": [
        {"op": "shared_get", "key": "k"},
        {"op": "shared_set", "key": "k", "value": "v1", "cas": 0},
        {"op": "shared_get", "key": "k"},
        {"op": "shared_set", "key": "k", "value": "v2", "cas": 4000000000u32},
        {"op": "shared_increment", "key": "n"},
        {"op": "shared_increment", "key": "n"},
        {"op": "shared_get", "key": "n"}
    ]});
    let (real, simulated) = both(&script, "/", &[]);
    assert_eq!(
        op_fields(&real, "on_request_headers"),
        op_fields(&simulated, "on_request_headers")
    );
    assert_eq!(
        ops(&real, "on_request_headers")[..4],
        [
            ("shared_get".to_owned(), NOT_FOUND),
            ("shared_set".to_owned(), OK),
            ("shared_get".to_owned(), OK),
            ("shared_set".to_owned(), 8)
        ],
        "absent, written, read, and a stale CAS refused as CasMismatch"
    );
}

#[test]
fn metrics_answer_alike() {
    let script = json!({"on_request_headers": [
        {"op": "define_metric", "kind": 0, "name": "probe_counter"},
        {"op": "increment_metric", "name": "probe_counter", "by": 0},
        {"op": "increment_metric", "name": "probe_counter", "by": 3},
        {"op": "get_metric", "name": "probe_counter"},
        {"op": "define_metric", "kind": 1, "name": "probe_gauge"},
        {"op": "record_metric", "name": "probe_gauge", "value": 7},
        {"op": "increment_metric", "name": "probe_gauge", "by": -2},
        {"op": "get_metric", "name": "probe_gauge"}
    ]});
    let mut both = Both::start(&script);
    both.send("/", &[]);
    let (real, simulated) = both.events();
    assert_eq!(
        op_fields(&real, "on_request_headers"),
        op_fields(&simulated, "on_request_headers")
    );
    assert_eq!(op_event(&real, "on_request_headers", 3).fields["value"], 3);
    assert_eq!(op_event(&real, "on_request_headers", 7).fields["value"], 5);
    eventually("Envoy shows the counter", Duration::from_secs(3), || {
        both.real
            .envoy
            .stat("wasmcustom.probe_counter")
            .unwrap_or(0)
            == 3
    });
}

#[test]
fn wasi_stdout_and_stderr_become_info_and_error_lines() {
    let script = json!({"on_request_headers": [
        {"op": "print", "fd": 1, "message": "to stdout\n"},
        {"op": "print", "fd": 2, "message": "to stderr\n"}
    ]});
    let mut both = Both::start(&script);
    both.send("/", &[]);
    let (real, simulated) = both.events();
    assert_eq!(
        op_fields(&real, "on_request_headers"),
        op_fields(&simulated, "on_request_headers")
    );
    let info = both.real.lines_at("info");
    let error = both.real.lines_at("error");
    assert!(info.iter().any(|l| l.ends_with("to stdout")), "{info:?}");
    assert!(error.iter().any(|l| l.ends_with("to stderr")), "{error:?}");
    let sim_lines = both.simulated.envoy.logs().recent();
    assert!(sim_lines.iter().any(|l| l.message == "to stdout"));
    assert!(sim_lines.iter().any(|l| l.message == "to stderr"));
}

#[test]
fn fail_open_fails_the_trapping_stream_and_skips_the_filter_after_alike() {
    let script = json!({"on_request_headers": [{"op": "trap", "stream": 1}]});
    let mut both = Both::start_with(&script, "FAIL_OPEN", FailurePolicy::FailOpen, None);
    for _ in 0..3 {
        both.send_without_waiting("/");
    }
    // The stream whose callback trapped fails; the filter is skipped from then on.
    assert_eq!(both.real_statuses, [503, 200, 200]);
    assert_eq!(both.simulated_statuses, [503, 200, 200]);
    let streams = |events: &[Event]| {
        events
            .iter()
            .filter(|e| e.kind() == "enter" && e.cb() == "on_request_headers")
            .count()
    };
    // Envoy writes its log a little after the fact.
    eventually(
        "Envoy logged the trapping stream",
        Duration::from_secs(3),
        || streams(&both.real.events()) >= 1,
    );
    std::thread::sleep(Duration::from_millis(200));
    let (real, simulated) = both.events();
    assert_eq!(
        (streams(&real), streams(&simulated)),
        (1, 1),
        "no callback after the trap"
    );
}

#[test]
fn modules_the_host_cannot_run_are_refused_alike() {
    let dir = tempfile::tempdir().expect("a directory");
    let modules = [
        (
            "missing-import",
            r#"(module
                 (import "env" "proxy_teleport" (func (param i32) (result i32)))
                 (memory (export "memory") 1)
                 (func (export "proxy_abi_version_0_2_1")))"#,
        ),
        (
            "wrong-signature",
            r#"(module
                 (import "env" "proxy_log" (func (param i32) (result i32)))
                 (memory (export "memory") 1)
                 (func (export "proxy_abi_version_0_2_1")))"#,
        ),
        ("no-abi-version", r#"(module (memory (export "memory") 1))"#),
    ];
    let backends = Backends::start(&[]);
    for (name, text) in modules {
        let wasm = wat::parse_str(text).expect("valid text format");
        let path = dir.path().join(format!("{name}.wasm"));
        std::fs::write(&path, &wasm).expect("the module");
        assert!(
            sluice_host::Host::new().expect("host").load(&wasm).is_err(),
            "{name}: the simulator took it"
        );
        let refused = refused_by_envoy(&path, &backends);
        eprintln!("{name}: Envoy said: {refused}");
    }
}

/// Starts Envoy with `wasm` as the plugin's module: it must refuse it. What it said.
fn refused_by_envoy(wasm: &Path, backends: &Backends) -> String {
    let plugin = Plugin {
        wasm: wasm.to_path_buf(),
        ..Plugin::probe("{}")
    };
    let config = sluice_e2e::real_envoy::plugin_config(
        &plugin,
        backends.upstream.addr(),
        backends.upstream.addr(),
    );
    match Envoy::start(&config, 1) {
        Ok(envoy) => panic!("Envoy took {}: {}", wasm.display(), envoy.log_tail(20)),
        Err(refusal) => refusal.to_string(),
    }
}

/// A probe whose every stream calls `limits` (with a timeout of 300 ms) and reads the answer
/// and the root's status.
fn calling_probe() -> Value {
    json!({
        "on_request_headers": [
            {"op": "http_call", "cluster": "limits", "headers": [[":path", "/"], [":method", "GET"], [":authority", "limits"]], "timeout_ms": 300}
        ],
        "on_http_call_response": [{"op": "callout_answer"}, {"op": "status"}]
    })
}

/// The callout answer each host delivered: `on_http_call_response`'s header, body and
/// trailer counts, and what the probe read there.
fn delivered(events: &[Event]) -> (Vec<u64>, Vec<Value>) {
    let args = events
        .iter()
        .find(|e| e.kind() == "enter" && e.cb() == "on_http_call_response")
        .map(|e| e.args()[1..].to_vec())
        .unwrap_or_default();
    (args, op_fields(events, "on_http_call_response"))
}

/// What each host delivered of a callout.
type Delivered = (Vec<u64>, Vec<Value>);

/// Both hosts' callouts to a server that misbehaves as `misbehaviour` says.
fn failed_callout(misbehaviour: Misbehaviour) -> (Delivered, Delivered) {
    let runtime = sluice_e2e::runtime();
    let target = runtime.block_on(misbehaving::start(misbehaviour));
    callout_to(target)
}

/// Both hosts' callouts to `target`.
fn callout_to(target: SocketAddr) -> (Delivered, Delivered) {
    let mut both = Both::start_with(
        &calling_probe(),
        "FAIL_CLOSED",
        FailurePolicy::FailClosed,
        Some(target),
    );
    both.send("/", &[]);
    let (real, simulated) = both.events();
    (delivered(&real), delivered(&simulated))
}

#[test]
fn a_callout_reset_mid_body_arrives_without_headers_alike() {
    let (real, simulated) = failed_callout(Misbehaviour::ResetMidBody);
    assert_eq!(real, simulated);
    assert_eq!(real.0, [0, 0, 0], "no headers, no body, no trailers");
    assert_eq!(real.1[0]["status_header"]["status"], BAD_ARGUMENT);
    assert_eq!(real.1[0]["body"]["status"], NOT_FOUND);
    assert_eq!(real.1[1]["code"], 11, "BrokenConnection");
    assert_eq!(real.1[1]["message"]["text"], "reset");
}

#[test]
fn a_callout_answer_over_32_mib_arrives_without_headers_alike() {
    let limit = sluice_sim::transport::RESPONSE_BUFFER_LIMIT;
    let (real, simulated) = failed_callout(Misbehaviour::Sized(limit + 1));
    assert_eq!(real, simulated);
    assert_eq!(real.0, [0, 0, 0]);
}

#[test]
fn a_stream_closed_by_the_filter_gets_no_response_alike() {
    let script = json!({"on_request_headers": [{"op": "close", "kind": 0}]});
    let mut both = Both::start(&script);
    both.send("/", &[]);
    let (real, simulated) = both.events();
    // The client's connection is reset: no status at all.
    assert_eq!(both.real_statuses, [0]);
    assert_ne!(both.simulated_statuses, [200]);
    let reached = |events: &[Event]| {
        events
            .iter()
            .any(|e| e.kind() == "enter" && e.cb() == "on_response_headers")
    };
    assert!(
        !reached(&real) && !reached(&simulated),
        "no response for the filter"
    );
}

#[test]
fn envoys_clock_is_the_wall_clock_and_the_simulators_the_traces() {
    let script = json!({"on_request_headers": [{"op": "time"}]});
    let (real, simulated) = both(&script, "/", &[]);
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as u64;
    let read = |events: &[Event]| {
        op_event(events, "on_request_headers", 0).fields["ns"]
            .as_u64()
            .expect("ns")
    };
    assert!(
        now_ns.abs_diff(read(&real)) < 60_000_000_000,
        "Envoy: the wall clock"
    );
    assert_eq!(
        read(&simulated),
        sluice_e2e::probe::START_NS,
        "the simulator: the replay's clock"
    );
}

#[test]
fn envoy_ticks_on_without_traffic_where_a_replay_stops() {
    let script = json!({"on_vm_start": [{"op": "tick", "ms": 50}]});
    let backends = Backends::start(&[]);
    let real = EnvoyProbe::start(
        &Plugin::probe(&script.to_string()),
        1,
        backends.upstream.addr(),
        backends.upstream.addr(),
    )
    .expect("Envoy starts with the probe");
    let ticks = |events: &[Event]| {
        events
            .iter()
            .filter(|e| e.kind() == "enter" && e.cb() == "on_tick")
            .count()
    };
    // No request at all: Envoy's VMs tick regardless (the worker's and the main thread's).
    eventually(
        "Envoy ticks with no traffic",
        Duration::from_secs(5),
        || ticks(&real.events()) >= 10,
    );
    let simulated = Probe::try_start(script, &Setup::default()).expect("the probe");
    assert_eq!(
        ticks(&simulated.events()),
        0,
        "a replay ticks only while it has traffic"
    );
}

#[test]
fn properties_the_simulator_lacks_are_answered_by_envoy() {
    let paths: &[&[&str]] = &[
        &["request", "total_size"],
        &["connection", "mtls"],
        &["upstream", "address"],
        &["xds", "cluster_name"],
    ];
    let steps: Vec<Value> = paths
        .iter()
        .map(|path| json!({"op": "property", "path": path}))
        .collect();
    let (real, simulated) = both(&json!({"on_log": steps}), "/", &[]);
    let statuses = |events: &[Event]| -> Vec<u64> {
        ops(events, "on_log").into_iter().map(|(_, s)| s).collect()
    };
    assert_eq!(statuses(&simulated), [NOT_FOUND; 4], "the simulator");
    assert_eq!(statuses(&real), [OK; 4], "Envoy answers them all in on_log");
}

#[test]
fn a_callout_that_times_out_arrives_as_a_504_alike() {
    let (real, simulated) = failed_callout(Misbehaviour::Hang);
    assert_eq!(real, simulated);
    assert_eq!(real.1[0]["status_header"]["value"]["text"], "504");
    assert_eq!(
        real.1[0]["body"]["value"]["text"],
        "upstream request timeout"
    );
}

#[test]
fn a_callout_to_a_refused_port_arrives_as_a_503_alike() {
    let closed = SocketAddr::from(([127, 0, 0, 1], sluice_harness::free_port().expect("a port")));
    let (real, simulated) = callout_to(closed);
    assert_eq!(real.1[0]["status_header"]["value"]["text"], "503");
    // The body's words too: the simulator said "reset reason: connection failure" until this
    // test ran in Envoy 1.40.
    assert_eq!(real, simulated);
}

#[test]
fn a_log_level_above_critical_is_bad_argument_alike() {
    let script =
        json!({"on_request_headers": [{"op": "log_at", "level": 6, "message": "too high"}]});
    let mut both = Both::start(&script);
    both.send("/", &[]);
    let (real, simulated) = both.events();
    assert_eq!(
        ops(&real, "on_request_headers"),
        ops(&simulated, "on_request_headers")
    );
    assert_eq!(
        ops(&real, "on_request_headers"),
        [("log_at".to_owned(), BAD_ARGUMENT)]
    );
    assert_eq!(both.real_statuses, [200], "Envoy goes on");
    assert!(both.real.envoy.is_running());
}

#[test]
fn a_grpc_call_is_made_by_envoy_where_the_simulator_has_no_grpc_client() {
    let script = json!({"on_request_headers": [
        {"op": "grpc_call", "cluster": "limits", "service": "probe.Service", "method": "Call", "timeout_ms": 100}
    ]});
    let (real, simulated) = both(&script, "/", &[]);
    assert_eq!(
        ops(&real, "on_request_headers"),
        [("grpc_call".to_owned(), OK)]
    );
    assert_eq!(
        ops(&simulated, "on_request_headers"),
        [("grpc_call".to_owned(), 10)],
        "InternalFailure"
    );
}

#[test]
fn envoy_calls_on_queue_ready_where_the_simulator_never_does() {
    let script = json!({
        "on_vm_start": [{"op": "register_queue", "name": "q"}],
        "on_request_headers": [{"op": "enqueue", "vm_id": "probe", "name": "q", "value": "v"}]
    });
    let (real, simulated) = both(&script, "/", &[]);
    assert_eq!(
        op_fields(&real, "on_request_headers"),
        op_fields(&simulated, "on_request_headers"),
        "the queue resolved and written alike"
    );
    let ready = |events: &[Event]| {
        events
            .iter()
            .filter(|e| e.kind() == "enter" && e.cb() == "on_queue_ready")
            .count()
    };
    assert!(ready(&real) >= 1, "Envoy: on_queue_ready");
    assert_eq!(ready(&simulated), 0, "the simulator: never");
}

#[test]
fn envoys_random_bytes_differ_from_run_to_run_and_the_simulators_repeat() {
    let script = json!({"on_request_headers": [{"op": "random", "len": 16}]});
    let bytes = |events: &[Event]| op_event(events, "on_request_headers", 0).raw();
    let (real_1, simulated_1) = both(&script, "/", &[]);
    let (real_2, simulated_2) = both(&script, "/", &[]);
    assert_ne!(bytes(&real_1), bytes(&real_2), "Envoy");
    assert_eq!(bytes(&simulated_1), bytes(&simulated_2), "the simulator");
    assert_eq!(bytes(&real_1).len(), 16);
}

/// What each host did with a stream whose filter sent two local replies as `script` says:
/// the status the client got (`None`: none within 3 s), and whether the stream ended.
fn two_local_replies(script: &Value) -> ((Option<u16>, bool), (Option<u16>, bool)) {
    let mut both = Both::start(script);
    let ingress = both.real.envoy.listener("ingress").expect("ingress");
    let waiting = std::thread::spawn(move || http::get(ingress, "/", &[("host", "shop.example")]));
    std::thread::sleep(Duration::from_secs(3));
    let real_status = waiting
        .is_finished()
        .then(|| waiting.join().ok()?.ok().map(|a| a.status))
        .flatten();
    let ended = |events: &[Event]| {
        events
            .iter()
            .any(|e| e.kind() == "enter" && e.cb() == "on_delete")
    };
    let real_ended = ended(&both.real.events());
    both.send_simulated("/", &[]);
    let simulated_status = both.simulated_statuses.first().copied();
    let simulated_ended = ended(&both.simulated.events());
    (
        (real_status, real_ended),
        (simulated_status, simulated_ended),
    )
}

#[test]
fn a_second_local_reply_from_the_response_path_takes_the_first_ones_place_alike() {
    // envoy#28826 had the stream hang: a local reply, and another from its own response
    // headers. Envoy 1.40 sends the second.
    let (real, simulated) = two_local_replies(&json!({
        "on_request_headers": [{"op": "local_reply", "status": 429}],
        "on_response_headers": [{"op": "local_reply", "status": 418}],
        "returns": {"on_request_headers": "pause"}
    }));
    assert_eq!(
        real,
        (Some(418), true),
        "the second's status, and the stream ends"
    );
    assert_eq!(real, simulated);
}

#[test]
fn two_local_replies_in_one_callback_send_the_first_alike() {
    let (real, simulated) = two_local_replies(&json!({
        "on_request_headers": [
            {"op": "local_reply", "status": 403, "body": "one"},
            {"op": "local_reply", "status": 404, "body": "two"}
        ],
        "returns": {"on_request_headers": "pause"}
    }));
    assert_eq!(
        real,
        (Some(403), true),
        "Envoy: the first, and the stream ends"
    );
    assert_eq!(real, simulated);
}

#[test]
fn fail_reloads_backoff_waits_at_least_its_base_and_jitters_in_envoy() {
    // Each VM passes its first stream and traps on its second; a request each 50 ms.
    let script = json!({"on_request_headers": [{"op": "trap", "stream": 2}]});
    let backends = Backends::start(&[]);
    let real = EnvoyProbe::start(
        &Plugin::probe(&script.to_string()).failing("FAIL_RELOAD"),
        1,
        backends.upstream.addr(),
        backends.upstream.addr(),
    )
    .expect("Envoy starts with the probe");
    let ingress = real.envoy.listener("ingress").expect("ingress");
    let started = std::time::Instant::now();
    let mut passed_at = Vec::new();
    let mut timeline = Vec::new();
    while passed_at.len() < 4 && started.elapsed() < Duration::from_secs(15) {
        let at = started.elapsed();
        let status = http::get(ingress, "/", &[]).map_or(0, |a| a.status);
        timeline.push((at.as_millis(), status));
        if status == 200 {
            passed_at.push(at);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("FAIL_RELOAD: (ms, status) {timeline:?}");
    let gaps: Vec<f64> = passed_at
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect();
    eprintln!("FAIL_RELOAD: a new VM every {gaps:.2?} s (base 1 s)");
    assert_eq!(passed_at.len(), 4, "{gaps:?}");
    // Not sooner than the base interval after the last load (the trap came ~50 ms after it),
    // and within the jitter's cap of twice the base.
    assert!(gaps.iter().all(|&g| (0.95..=2.1).contains(&g)), "{gaps:?}");
}

#[test]
fn envoy_ends_its_root_contexts_at_shutdown_where_a_replay_never_does() {
    let script = json!({});
    let mut both = Both::start(&script);
    both.send("/", &[]);
    both.real.envoy.stop();
    let (real, simulated) = both.events();
    let root_done = |events: &[Event]| {
        events
            .iter()
            .filter(|e| e.kind() == "enter" && e.cb() == "on_done" && e.ctx() == 1)
            .count()
    };
    eprintln!(
        "Envoy: on_done of a root context {} times at shutdown",
        root_done(&real)
    );
    assert_eq!(root_done(&simulated), 0, "a replay never drains a VM");
    assert!(root_done(&real) >= 1, "Envoy drains its VMs when it stops");
}
