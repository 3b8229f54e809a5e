//! The Envoy each setup runs: one listener whose HTTP filters are the setup's, routing to a
//! second listener of the same Envoy that answers 200 itself, so that no upstream process
//! shares the cores, and clusters for sluice-server's HTTP and gRPC APIs.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;
use sluice_core::key::LimitKey;
use sluice_core::policy::Policy;
use sluice_core::wire::write_decide_request;
use sluice_harness::dynamic_module_filter;

use super::plan::{LIMIT_BURST, LIMIT_RATE, limit};
use super::setup::{LEASE, Setup};

/// Where a setup's Envoy sends what: its listeners' ports and sluice-server's addresses.
pub struct Addresses {
    /// The listener the load generator calls.
    pub ingress: SocketAddr,
    /// The listener that stands in for the upstream.
    pub origin: SocketAddr,
    /// sluice-server (HTTP and gRPC on one port) for the setups with one thread.
    pub server: SocketAddr,
    /// sluice-server with several threads, for [`Setup::SluiceThreads`].
    pub threaded_server: SocketAddr,
}

/// The .wasm files the setups load.
pub struct Wasm<'a> {
    /// sluice's filter.
    pub sluice: &'a Path,
    /// The no-op filter.
    pub noop: &'a Path,
}

/// A limit no bench traffic reaches.
const OPEN_LIMIT: &str = r#"{"algorithm": "gcra", "rate": 1000000, "per": "1s", "burst": 1000000}"#;
/// A limit that denies nearly every request of a hot key.
pub const DENYING_LIMIT: &str = r#"{"algorithm": "gcra", "rate": 1, "per": "1s", "burst": 1}"#;

/// sluice's policy: one rule, keyed by the request's `x-api-key`, with `limit` and `lease`,
/// asking sluice-server through [`SERVER_CLUSTER`].
pub fn sluice_policy(limit: &str, lease: Option<&str>) -> String {
    policy_through(SERVER_CLUSTER, limit, lease)
}

/// The per-request floor module's configuration: the cluster it asks through, then the body
/// sluice's module posts for its policy's one rule, before the key and after it, a line each
/// (the body is compact JSON, with no line break).
fn callout_floor_config() -> anyhow::Result<String> {
    // A key that no escape changes, found once in the body and cut out.
    const KEY: &str = "KEYKEYKEY";
    let policy = Policy::from_json(sluice_policy(OPEN_LIMIT, None).as_bytes())?;
    let rule = policy
        .rules
        .first()
        .context("the bench's policy has a rule")?;
    let key = LimitKey::from_parts([KEY.as_bytes()]);
    let mut body = Vec::new();
    write_decide_request(&mut body, [(&rule.template, &key)]);
    let body = String::from_utf8(body)?;
    let (head, tail) = body
        .split_once(KEY)
        .context("the key in the callout's body")?;
    Ok(format!("{SERVER_CLUSTER}\n{head}\n{tail}"))
}

/// [`sluice_policy`] asking through `cluster`.
fn policy_through(cluster: &str, limit: &str, lease: Option<&str>) -> String {
    let lease = lease
        .map(|l| format!(r#", "lease": {l}"#))
        .unwrap_or_default();
    format!(
        r#"{{"cluster": "{cluster}", "timeout": "100ms", "rules": [{{"name": "bench", "key": [{{"header": "x-api-key"}}], "limit": {limit}{lease}}}]}}"#
    )
}

/// sluice-server's gRPC configuration (envoyproxy/ratelimit's format): each `api_key` value
/// limited as the wasm setups limit it.
pub const RLS_CONFIG: &str = "domain: bench
descriptors:
  - key: api_key
    rate_limit:
      unit: second
      requests_per_unit: 1000000
      sluice: {algorithm: gcra, rate: 1000000, per: 1s, burst: 1000000}
";

/// sluice-server's gRPC configuration of the limit the ways in are measured over
/// ([`limit`]), for each `api_key` of domain `bench-limited`.
pub fn rls_limited() -> String {
    let (rate, burst) = (LIMIT_RATE, LIMIT_BURST);
    format!(
        "domain: bench-limited
descriptors:
  - key: api_key
    rate_limit:
      unit: second
      requests_per_unit: {rate}
      sluice: {{algorithm: gcra, rate: {rate}, per: 1s, burst: {burst}}}
"
    )
}

/// sluice-server's quota configuration of that limit, for each API key's bucket.
pub fn rlqs_limited() -> String {
    format!(
        "domain: bench
buckets:
  - match: {{key: \"*\"}}
    name: bench
    limit: {}
",
        limit()
    )
}

/// The whole Envoy configuration of `setup`: its listener on `addresses.ingress`.
pub fn envoy_yaml(setup: Setup, addresses: &Addresses, wasm: &Wasm<'_>) -> anyhow::Result<String> {
    envoy_yaml_leasing(setup, addresses, wasm, LEASE)
}

/// [`envoy_yaml`], with `lease` for the lease setups' rule in place of [`LEASE`].
pub fn envoy_yaml_leasing(
    setup: Setup,
    addresses: &Addresses,
    wasm: &Wasm<'_>,
    lease: &str,
) -> anyhow::Result<String> {
    envoy_yaml_of(&[(setup, addresses.ingress)], addresses, wasm, lease)
}

/// One Envoy with a listener for each setup of `listeners`, on its address, so that the setups
/// can take turns in the same process: each listener's filters are its setup's own (a .wasm
/// in a VM of its own), all route to the one origin listener.
pub fn shared_envoy_yaml(
    listeners: &[(Setup, SocketAddr)],
    addresses: &Addresses,
    wasm: &Wasm<'_>,
) -> anyhow::Result<String> {
    envoy_yaml_of(listeners, addresses, wasm, LEASE)
}

/// [`shared_envoy_yaml`], with `lease` for the lease setups' rule.
fn envoy_yaml_of(
    listeners: &[(Setup, SocketAddr)],
    addresses: &Addresses,
    wasm: &Wasm<'_>,
    lease: &str,
) -> anyhow::Result<String> {
    let ingresses = listeners
        .iter()
        .map(|&(setup, address)| ingress(setup, address, wasm, lease))
        .collect::<anyhow::Result<String>>()?;
    let origin = listener(
        "origin",
        addresses.origin,
        r#"direct_response: {status: 200, body: {inline_string: "ok\n"}}"#,
        "",
    );
    let (origin_ip, origin_port) = (addresses.origin.ip(), addresses.origin.port());
    let sluice_clusters: String = [
        (SERVER_CLUSTER, addresses.server),
        (THREADED_SERVER_CLUSTER, addresses.threaded_server),
        (RLS_CLUSTER, addresses.server),
    ]
    .into_iter()
    .map(|(name, address)| http2_cluster(name, address))
    .collect();
    Ok(format!(
        r#"
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
static_resources:
  listeners:{ingresses}{origin}
  clusters:
  - name: upstream
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: {origin_ip}, port_value: {origin_port}}}}}}}{sluice_clusters}
"#
    ))
}

/// The clusters by which Envoy reaches sluice-server: the filters' callouts to the server
/// with one thread, to the one with [`super::SERVER_THREADS`], and the native filters' gRPC.
pub const SERVER_CLUSTER: &str = "sluice";
/// See [`SERVER_CLUSTER`].
pub const THREADED_SERVER_CLUSTER: &str = "sluice_threads";
/// See [`SERVER_CLUSTER`].
pub const RLS_CLUSTER: &str = "sluice_rls";

/// `setup`'s listener on `address`: its filters, then the route to the origin.
fn ingress(
    setup: Setup,
    address: SocketAddr,
    wasm: &Wasm<'_>,
    lease: &str,
) -> anyhow::Result<String> {
    let rate_limits = if matches!(setup, Setup::NativeGrpc | Setup::NativeGrpcLimited) {
        "
                  rate_limits:
                  - actions:
                    - request_headers: {header_name: x-api-key, descriptor_key: api_key}"
    } else {
        ""
    };
    Ok(listener(
        &format!("ingress_{}", setup.id()),
        address,
        &format!("route:\n                  cluster: upstream{rate_limits}"),
        &http_filters(setup, wasm, lease)?,
    ))
}

/// A cluster of the one endpoint `address`, spoken to over cleartext HTTP/2 (the filter's
/// callouts and the native filter's gRPC alike); as a YAML list item.
fn http2_cluster(name: &str, address: SocketAddr) -> String {
    let (ip, port) = (address.ip(), address.port());
    format!(
        r#"
  - name: {name}
    type: STATIC
    connect_timeout: 0.25s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: {ip}, port_value: {port}}}}}}}"#
    )
}

/// A listener on `address` whose one route (`/`) does `action`, through `filters` and the
/// router; as a YAML list item.
fn listener(name: &str, address: SocketAddr, action: &str, filters: &str) -> String {
    let (ip, port) = (address.ip(), address.port());
    format!(
        r#"
  - name: {name}
    address: {{socket_address: {{address: {ip}, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                {action}
          http_filters:{filters}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"#
    )
}

/// The HTTP filters `setup` puts before the router, as YAML list items, its rule leasing with
/// `lease` where it leases.
fn http_filters(setup: Setup, wasm: &Wasm<'_>, lease: &str) -> anyhow::Result<String> {
    Ok(match setup {
        Setup::NoFilter => String::new(),
        Setup::Noop => wasm_filter(setup, wasm.noop, "{}"),
        Setup::NoopModule => dynamic_module_filter("noop", "sluice_noop_module", "{}"),
        Setup::FloorModule => dynamic_module_filter("floor", "sluice_noop_module", "{}"),
        Setup::CalloutFloorModule => {
            dynamic_module_filter("callout", "sluice_noop_module", &callout_floor_config()?)
        }
        Setup::SluiceModule => {
            dynamic_module_filter("sluice", "sluice_module", &sluice_policy(OPEN_LIMIT, None))
        }
        Setup::SluiceModuleLease => dynamic_module_filter(
            "sluice",
            "sluice_module",
            &sluice_policy(OPEN_LIMIT, Some(lease)),
        ),
        Setup::SluiceModuleLeaseLimited => dynamic_module_filter(
            "sluice",
            "sluice_module",
            &sluice_policy(&limit(), Some(lease)),
        ),
        Setup::LocalRatelimit => "
          - name: envoy.filters.http.local_ratelimit
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
              stat_prefix: bench
              token_bucket: {max_tokens: 1000000, tokens_per_fill: 1000000, fill_interval: 1s}
              filter_enabled:
                runtime_key: bench_enabled
                default_value: {numerator: 100, denominator: HUNDRED}
              filter_enforced:
                runtime_key: bench_enforced
                default_value: {numerator: 100, denominator: HUNDRED}"
            .to_owned(),
        Setup::Sluice => wasm_filter(setup, wasm.sluice, &sluice_policy(OPEN_LIMIT, None)),
        Setup::SluiceThreads => wasm_filter(
            setup,
            wasm.sluice,
            &policy_through(THREADED_SERVER_CLUSTER, OPEN_LIMIT, None),
        ),
        Setup::SluiceLease => {
            wasm_filter(setup, wasm.sluice, &sluice_policy(OPEN_LIMIT, Some(lease)))
        }
        Setup::SluiceDenying => {
            wasm_filter(setup, wasm.sluice, &sluice_policy(DENYING_LIMIT, None))
        }
        Setup::SluiceLeaseLimited => wasm_filter(
            setup,
            wasm.sluice,
            &sluice_policy(&limit(), Some(lease)),
        ),
        Setup::NativeGrpc => native_ratelimit("bench"),
        Setup::NativeGrpcLimited => native_ratelimit("bench-limited"),
        Setup::RlqsLimited => "
          - name: envoy.filters.http.rate_limit_quota
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
              domain: bench
              rlqs_server: {envoy_grpc: {cluster_name: sluice_rls}}
              bucket_matchers:
                on_no_match:
                  action:
                    name: per-key
                    typed_config:
                      \"@type\": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                      bucket_id_builder:
                        bucket_id_builder:
                          key:
                            custom_value:
                              name: key
                              typed_config:
                                \"@type\": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                header_name: x-api-key
                      reporting_interval: 5s
                      # Nothing admitted before a bucket's first assignment, so that the
                      # bound needs no term for it.
                      no_assignment_behavior:
                        fallback_rate_limit: {blanket_rule: DENY_ALL}
                      expired_assignment_behavior:
                        expired_assignment_behavior_timeout: 315360000s
                        fallback_rate_limit: {blanket_rule: ALLOW_ALL}"
            .to_owned(),
    })
}

/// Envoy's native `ratelimit` filter asking sluice-server about `domain`.
fn native_ratelimit(domain: &str) -> String {
    format!(
        "
          - name: envoy.filters.http.ratelimit
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: {domain}
              timeout: 0.1s
              failure_mode_deny: false
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{cluster_name: {RLS_CLUSTER}}}"
    )
}

/// A proxy-wasm filter running `file` in V8 with `configuration`, in a VM of its own: named
/// for `setup`, as its VM and root context are.
fn wasm_filter(setup: Setup, file: &Path, configuration: &str) -> String {
    let name = setup.id();
    let configuration = serde_json::Value::String(configuration.to_owned()).to_string();
    let file = file.display();
    format!(
        r#"
          - name: {name}
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: {name}
                root_id: {name}
                failure_policy: FAIL_CLOSED
                vm_config:
                  vm_id: {name}
                  runtime: envoy.wasm.runtime.v8
                  code: {{local: {{filename: "{file}"}}}}
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: {configuration}"#
    )
}

#[cfg(test)]
mod tests {
    use sluice_core::key::LimitKey;
    use sluice_core::policy::Policy;
    use sluice_core::wire::DecideRequest;

    use super::{OPEN_LIMIT, SERVER_CLUSTER, callout_floor_config, sluice_policy};

    #[test]
    fn the_per_request_floor_posts_the_check_sluices_module_sends_for_the_bench_rule() {
        let config = callout_floor_config().expect("a configuration");
        let lines: Vec<&str> = config.split('\n').collect();
        let [cluster, head, tail] = lines[..] else {
            panic!("three lines: {config:?}");
        };
        assert_eq!(cluster, SERVER_CLUSTER);
        let body = format!("{head}k42{tail}");
        let sent: DecideRequest = serde_json::from_str(&body).expect("a decide body");
        let policy = Policy::from_json(sluice_policy(OPEN_LIMIT, None).as_bytes()).expect("valid");
        let key = LimitKey::from_parts([&b"k42"[..]]);
        assert_eq!(sent.checks, vec![policy.rules[0].check(key)]);
    }
}
