//! The simulator's model of Envoy's native rate limit filter, held against Envoy 1.40: the same
//! requests through a real Envoy and through the model must make the same descriptors, action
//! by action. sluice-server writes down what Envoy sent (`--rls-descriptor-log`).

use std::collections::BTreeMap;
use std::net::IpAddr;

use sluice_e2e::real_envoy::{Backends, any_port, get, localize};
use sluice_harness::{Envoy, validate_envoy_config};
use sluice_sim::native::NativeConfig;

/// A bootstrap with Envoy's native rate limit filters asking sluice-server at `backends`: the
/// connection manager's `manager` settings and one virtual host `virtual_host` (YAML at the
/// indentation of a `virtual_hosts` item's fields), and a filter for each `(domain, settings)`
/// of `filters` (YAML at the indentation of a filter's `typed_config` fields).
pub(super) fn native_config(
    manager: &str,
    virtual_host: &str,
    filters: &[(&str, &str)],
    backends: &Backends,
) -> String {
    let filters: String = filters
        .iter()
        .map(|(domain, settings)| {
            format!(
                r#"
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: {domain}
              timeout: 1s
              failure_mode_deny: true
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {{envoy_grpc: {{cluster_name: sluice_rls}}}}
{settings}"#
            )
        })
        .collect();
    grpc_filter_config(manager, virtual_host, &filters, "sluice_rls", backends)
}

/// A bootstrap around `http_filters` (YAML items at the indentation of `http_filters:`, before
/// the router), with the connection manager's `manager` settings, one virtual host
/// `virtual_host`, the cluster `grpc_cluster` reaching sluice-server's gRPC API (HTTP/2) and
/// `upstream`, all pointed at `backends`.
pub(super) fn grpc_filter_config(
    manager: &str,
    virtual_host: &str,
    http_filters: &str,
    grpc_cluster: &str,
    backends: &Backends,
) -> String {
    let config = format!(
        r#"
node: {{cluster: edge-proxy}}
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: 9901}}}}
static_resources:
  listeners:
  - name: ingress
    address: {{socket_address: {{address: 0.0.0.0, port_value: 10000}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
{manager}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
{virtual_host}
          http_filters:{http_filters}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: {grpc_cluster}
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: {grpc_cluster}
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: sluice-server, port_value: 8080}}}}}}}}]}}]
  - name: upstream
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: upstream
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: echo, port_value: 5678}}}}}}}}]}}]
"#
    );
    localize(
        &config,
        &[
            ("0.0.0.0:10000", any_port()),
            ("127.0.0.1:9901", any_port()),
            ("sluice-server:8080", backends.server_addr()),
            ("echo:5678", backends.upstream.addr()),
        ],
        &[],
    )
}

/// Every route exercises actions; the virtual host adds `(case, <x-case>)` to every request, so
/// each logged call names the request it came from.
const ROUTES: &str = r#"              rate_limits:
              - actions: [{request_headers: {header_name: x-case, descriptor_key: case}}]
              routes:
              - match: {prefix: "/headers"}
                route:
                  cluster: upstream
                  include_vh_rate_limits: true
                  rate_limits:
                  - actions: [{request_headers: {header_name: x-user, descriptor_key: user}}]
                  - actions:
                    - generic_key: {descriptor_value: skipping}
                    - request_headers: {header_name: x-user, descriptor_key: user, skip_if_absent: true}
              - match: {prefix: "/addresses"}
                route:
                  cluster: upstream
                  include_vh_rate_limits: true
                  rate_limits:
                  - actions: [{remote_address: {}}, {masked_remote_address: {v4_prefix_mask_len: 24}}]
              - match: {prefix: "/matches"}
                route:
                  cluster: upstream
                  include_vh_rate_limits: true
                  rate_limits:
                  - actions: [{header_value_match: {descriptor_value: gold, headers: [{name: x-tier, exact_match: gold}]}}]
                  - actions: [{header_value_match: {descriptor_key: not_gold, descriptor_value: other, expect_match: false, headers: [{name: x-tier, string_match: {prefix: go}}]}}]
                  - actions: [{header_value_match: {descriptor_value: tierless, headers: [{name: x-tier, present_match: false}]}}]
              - match: {prefix: "/clusters"}
                route:
                  cluster: upstream
                  include_vh_rate_limits: true
                  rate_limits:
                  - actions: [{destination_cluster: {}}, {source_cluster: {}}, {generic_key: {descriptor_key: plan, descriptor_value: free}}]
              - match: {prefix: "/query"}
                route:
                  cluster: upstream
                  include_vh_rate_limits: true
                  rate_limits:
                  - actions: [{query_parameters: {query_parameter_name: page, descriptor_key: page}}]
                  - actions: [{query_parameter_value_match: {descriptor_value: debugging, query_parameters: [{name: debug, present_match: true}]}}]
                  - actions: [{query_parameter_value_match: {descriptor_value: mode-a, query_parameters: [{name: mode, string_match: {exact: a}}]}}]
              - match: {prefix: "/metadata"}
                metadata: {filter_metadata: {sluice: {tier: gold}}}
                route:
                  cluster: upstream
                  include_vh_rate_limits: true
                  rate_limits:
                  - actions: [{metadata: {descriptor_key: tier, metadata_key: {key: sluice, path: [{key: tier}]}, source: ROUTE_ENTRY}}]
                  - actions: [{metadata: {descriptor_key: plan, metadata_key: {key: sluice, path: [{key: plan}]}, default_value: basic, source: ROUTE_ENTRY}}]
              - match: {prefix: "/own"}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions: [{generic_key: {descriptor_value: own}}, {request_headers: {header_name: x-case, descriptor_key: case}}]
              - match: {prefix: "/static"}
                direct_response: {status: 200}
              - match: {prefix: "/"}
                route: {cluster: upstream}"#;

/// The domain, with no limits: every call is answered, and only what was sent matters here.
const LIMITS: &str = "domain: model\ndescriptors: []\n";

/// The requests: a path and the headers besides `x-case`.
fn cases() -> Vec<(&'static str, Vec<(&'static str, &'static str)>)> {
    vec![
        ("/headers", vec![("x-user", "ann")]),
        ("/headers", vec![]),
        ("/headers", vec![("x-user", "bob"), ("x-user", "eve")]),
        ("/addresses", vec![]),
        ("/addresses", vec![("x-forwarded-for", "203.0.113.77")]),
        (
            "/addresses",
            vec![("x-forwarded-for", "198.51.100.9, 203.0.113.80")],
        ),
        ("/addresses", vec![("x-forwarded-for", "not-an-address")]),
        ("/matches", vec![("x-tier", "gold")]),
        ("/matches", vec![("x-tier", "silver")]),
        ("/matches", vec![]),
        ("/clusters", vec![]),
        ("/query?page=2&debug", vec![]),
        ("/query?mode=a&page=", vec![]),
        ("/query?mode=b&debug=1", vec![]),
        ("/query?page=a%20b", vec![]),
        ("/query?page=a+b&page=c", vec![]),
        ("/query?mode=%61&debug", vec![]),
        ("/metadata", vec![]),
        ("/own", vec![]),
        ("/static", vec![]),
        ("/elsewhere", vec![]),
    ]
}

type Descriptors = Vec<Vec<(String, String)>>;

/// What the model sends for each case, by case number (no entry: no call).
fn modelled(config: &NativeConfig, authority: &str) -> BTreeMap<String, Descriptors> {
    let peer: IpAddr = "127.0.0.1".parse().expect("an address");
    let mut sent = BTreeMap::new();
    for (i, (path, extra)) in cases().iter().enumerate() {
        let mut headers: Vec<(String, String)> = vec![
            (":authority".into(), authority.into()),
            (":path".into(), (*path).into()),
            (":method".into(), "GET".into()),
            ("x-case".into(), i.to_string()),
        ];
        headers.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let request = config.downstream(&headers, peer);
        let calls = config.calls(&request);
        assert!(calls.len() <= 1, "one filter, one call");
        if let Some(call) = calls.into_iter().next() {
            sent.insert(i.to_string(), call.descriptors);
        }
    }
    sent
}

/// What Envoy sent for each case, from the server's descriptor log.
fn logged(log: &str) -> BTreeMap<String, Descriptors> {
    let mut sent = BTreeMap::new();
    for line in log.lines() {
        let call: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        assert_eq!(call["domain"], "model");
        let descriptors: Descriptors =
            serde_json::from_value(call["descriptors"].clone()).expect("descriptors");
        let case = descriptors
            .iter()
            .flatten()
            .find(|(k, _)| k == "case")
            .map(|(_, v)| v.clone())
            .expect("every call names its case");
        assert!(
            sent.insert(case.clone(), descriptors).is_none(),
            "case {case} twice"
        );
    }
    sent
}

#[test]
fn every_modelled_action_sends_what_envoy_sends() {
    let dir = tempfile::tempdir().expect("a directory");
    let rls = dir.path().join("ratelimit");
    std::fs::create_dir_all(&rls).expect("a directory");
    std::fs::write(rls.join("model.yaml"), LIMITS).expect("the limits");
    let log = dir.path().join("descriptors.jsonl");
    let backends = Backends::start(&[
        "--rls-config",
        rls.to_str().expect("UTF-8"),
        "--rls-descriptor-log",
        log.to_str().expect("UTF-8"),
    ]);
    let config = native_config(
        "          use_remote_address: true\n          xff_num_trusted_hops: 1",
        ROUTES,
        &[("model", "")],
        &backends,
    );
    validate_envoy_config(&config).expect("Envoy takes the configuration");
    let model = NativeConfig::parse(&config).expect("the model takes the configuration");
    let envoy = Envoy::start(&config, 1).expect("Envoy");
    let authority = envoy.listener("ingress").expect("the listener").to_string();
    for (i, (path, extra)) in cases().iter().enumerate() {
        let case = i.to_string();
        let mut headers = extra.clone();
        headers.push(("x-case", &case));
        let answer = get(&envoy, path, &headers);
        assert_eq!(answer.status, 200, "case {i} ({path}): {answer:?}");
    }
    let from_envoy = logged(&std::fs::read_to_string(&log).expect("the descriptor log"));
    let from_model = modelled(&model, &authority);
    for case in from_envoy.keys().chain(from_model.keys()) {
        assert_eq!(
            from_model.get(case),
            from_envoy.get(case),
            "case {case} {:?}: the model (left) and Envoy (right) differ",
            cases()[case.parse::<usize>().expect("a number")]
        );
    }
    assert!(
        from_envoy.len() >= cases().len() - 2,
        "most cases make a call: {from_envoy:?}"
    );
}
