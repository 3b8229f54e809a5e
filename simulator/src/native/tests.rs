use std::net::IpAddr;

use super::*;

/// The configuration shipped in envoy/: what users start from.
const SHIPPED: &str = include_str!("../../../envoy/envoy-ratelimit.yaml");

fn calls(
    config: &NativeConfig,
    path: &str,
    headers: &[(&str, &str)],
    peer: &str,
) -> Vec<FilterCall> {
    let mut all: Vec<(String, String)> = vec![
        (":authority".into(), "shop.example".into()),
        (":path".into(), path.into()),
        (":method".into(), "GET".into()),
    ];
    all.extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let peer: IpAddr = peer.parse().unwrap();
    let request = config.downstream(&all, peer);
    config.calls(&request)
}

fn descriptors(calls: &[FilterCall]) -> Vec<Vec<(&str, &str)>> {
    calls
        .iter()
        .flat_map(|c| c.descriptors.iter())
        .map(|d| d.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect())
        .collect()
}

/// A bootstrap around one virtual host's YAML (indented under `virtual_hosts:`) and the
/// filter's settings.
fn bootstrap(virtual_hosts: &str, manager_extra: &str) -> String {
    format!(
        r#"
node: {{cluster: edge-proxy}}
static_resources:
  listeners:
  - name: ingress
    filter_chains:
    - filters:
      - name: hcm
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
{manager_extra}
          route_config:
            virtual_hosts:
{virtual_hosts}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: edge
              rate_limit_service:
                grpc_service: {{envoy_grpc: {{cluster_name: rls}}}}
"#
    )
}

#[test]
fn the_shipped_configuration_sends_the_address_and_on_api_paths_the_key() {
    let config = NativeConfig::parse(SHIPPED).unwrap();
    assert_eq!(config.filters.len(), 1);
    assert_eq!(config.filters[0].domain, "edge");
    assert!(!config.filters[0].failure_mode_deny);
    assert_eq!(
        config.filters[0].timeout,
        std::time::Duration::from_millis(100)
    );
    let plain = calls(
        &config,
        "/index.html",
        &[("x-forwarded-for", "10.9.9.9")],
        "192.0.2.7",
    );
    assert_eq!(
        descriptors(&plain),
        vec![vec![("remote_address", "192.0.2.7")]]
    );
    let api = calls(
        &config,
        "/api/items?x=1",
        &[("x-api-key", "k1")],
        "192.0.2.7",
    );
    assert_eq!(
        descriptors(&api),
        vec![
            vec![("api_key", "k1")],
            vec![("remote_address", "192.0.2.7")]
        ]
    );
    // Without the header the route's descriptor is dropped, and the host's still goes.
    let keyless = calls(&config, "/api/items", &[], "192.0.2.7");
    assert_eq!(
        descriptors(&keyless),
        vec![vec![("remote_address", "192.0.2.7")]]
    );
}

#[test]
fn a_routes_own_limits_replace_the_hosts_unless_it_includes_them() {
    let yaml = bootstrap(
        r#"            - name: all
              domains: ["*"]
              rate_limits: [{actions: [{generic_key: {descriptor_value: host}}]}]
              routes:
              - match: {prefix: "/own"}
                route:
                  cluster: a
                  rate_limits: [{actions: [{destination_cluster: {}}]}]
              - match: {prefix: "/none"}
                route: {cluster: b}
              - match: {prefix: "/static"}
                direct_response: {status: 200}"#,
        "",
    );
    let config = NativeConfig::parse(&yaml).unwrap();
    assert_eq!(
        descriptors(&calls(&config, "/own", &[], "192.0.2.1")),
        vec![vec![("destination_cluster", "a")]]
    );
    assert_eq!(
        descriptors(&calls(&config, "/none", &[], "192.0.2.1")),
        vec![vec![("generic_key", "host")]]
    );
    assert!(
        calls(&config, "/static", &[], "192.0.2.1").is_empty(),
        "a direct response has no route entry"
    );
}

#[test]
fn every_modelled_action_makes_envoys_entry() {
    let yaml = bootstrap(
        r#"            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                metadata: {filter_metadata: {sluice: {tier: gold}}}
                route:
                  cluster: backend
                  rate_limits:
                  - actions:
                    - source_cluster: {}
                    - destination_cluster: {}
                    - remote_address: {}
                    - masked_remote_address: {v4_prefix_mask_len: 24}
                    - request_headers: {header_name: X-User, descriptor_key: user}
                    - generic_key: {descriptor_key: tier, descriptor_value: all}
                    - header_value_match: {descriptor_value: post, headers: [{name: ":method", exact_match: GET}], expect_match: false}
                    - query_parameters: {query_parameter_name: page, descriptor_key: page, skip_if_absent: true}
                    - query_parameter_value_match: {descriptor_value: debug, query_parameters: [{name: debug, present_match: true}]}
                    - metadata: {descriptor_key: tier, metadata_key: {key: sluice, path: [{key: tier}]}, source: ROUTE_ENTRY}"#,
        "          use_remote_address: true\n          xff_num_trusted_hops: 1",
    );
    let config = NativeConfig::parse(&yaml).unwrap();
    let headers = [
        (":method", "POST"),
        ("x-user", "ann"),
        ("x-forwarded-for", "203.0.113.77"),
    ];
    let sent = calls(&config, "/a?debug&page=2", &headers, "198.51.100.1");
    assert_eq!(
        descriptors(&sent),
        vec![vec![
            ("source_cluster", "edge-proxy"),
            ("destination_cluster", "backend"),
            ("remote_address", "203.0.113.77"),
            ("masked_remote_address", "203.0.113.0/24"),
            ("user", "ann"),
            ("tier", "all"),
            ("header_match", "post"),
            ("page", "2"),
            ("query_match", "debug"),
            ("tier", "gold"),
        ]]
    );
    // Without x-user, request_headers drops the descriptor (skip_if_absent is not set).
    assert!(calls(&config, "/a?debug", &[(":method", "POST")], "198.51.100.1").is_empty());
}

#[test]
fn what_cannot_be_modelled_is_refused_by_name_and_place() {
    let refused = |action: &str| {
        let yaml = bootstrap(
            &format!(
                "            - name: all\n              domains: [\"*\"]\n              rate_limits: [{{actions: [{action}]}}]\n              routes: [{{match: {{prefix: /}}, route: {{cluster: a}}}}]"
            ),
            "",
        );
        NativeConfig::parse(&yaml).unwrap_err().to_string()
    };
    let unknown = refused("{frobnicate: {}}");
    assert!(
        unknown.contains("virtual_hosts[0].rate_limits[0].actions[0]"),
        "{unknown}"
    );
    assert!(
        unknown.contains("`frobnicate`") && unknown.contains("request_headers"),
        "{unknown}"
    );
    let dynamic =
        refused("{metadata: {descriptor_key: k, metadata_key: {key: f, path: [{key: p}]}}}");
    assert!(
        dynamic.contains("trace does not") && dynamic.contains("ROUTE_ENTRY"),
        "{dynamic}"
    );
    let extension = refused("{extension: {name: x}}");
    assert!(extension.contains("`extension`"), "{extension}");
    let header_option =
        refused("{request_headers: {header_name: a, descriptor_key: b, omit: true}}");
    assert!(
        header_option.contains("actions[0].request_headers.omit"),
        "{header_option}"
    );
}

#[test]
fn a_runtime_key_set_to_zero_turns_its_entry_off() {
    let mut yaml = bootstrap(
        r#"            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route:
                  cluster: a
                  rate_limits:
                  - {disable_key: off_one, actions: [{generic_key: {descriptor_value: one}}]}
                  - {disable_key: on_one, actions: [{generic_key: {descriptor_value: two}}]}"#,
        "",
    );
    yaml.push_str("layered_runtime:\n  layers:\n  - name: static\n    static_layer:\n      ratelimit.off_one.http_filter_enabled: 0\n");
    let config = NativeConfig::parse(&yaml).unwrap();
    assert_eq!(
        descriptors(&calls(&config, "/", &[], "192.0.2.1")),
        vec![vec![("generic_key", "two")]]
    );
}
