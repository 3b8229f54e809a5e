//! What the tests against a real Envoy share: the shipped configs pointed at local addresses,
//! and a stack of a real Redis, a real sluice-server (in this process, on real time), a
//! forwarder in front of it that a test can freeze, an upstream, and real Envoys.
//!
//! The server runs in this process so that tests can stop it and start it again; what Envoy
//! sees of it is the forwarder's port, which stays the same.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_yaml_ng::Value;
use sluice_harness::http::{self, Answer};
use sluice_harness::{ACCESS_LOG, Envoy, ForwardingProxy, HarnessError, RedisServer, Upstream};
use sluice_server::config::Args;
use sluice_server::{RunningServer, ServerConfig};

use crate::runtime;

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `config` (Envoy YAML) with every socket address replaced by the one `addresses` gives for
/// its `host:port`, and every local `.wasm` file by the one `wasm` gives for its file name.
/// Nothing else changes. An address or a .wasm with no replacement fails the test, naming it:
/// a shipped config that gains an address must be pointed somewhere by its test.
pub fn localize(config: &str, addresses: &[(&str, SocketAddr)], wasm: &[(&str, &Path)]) -> String {
    let mut document: Value = serde_yaml_ng::from_str(config).expect("a YAML document");
    rewrite(&mut document, addresses, wasm);
    serde_yaml_ng::to_string(&document).expect("YAML")
}

fn rewrite(node: &mut Value, addresses: &[(&str, SocketAddr)], wasm: &[(&str, &Path)]) {
    match node {
        Value::Mapping(map) => {
            if let Some(Value::Mapping(socket)) = map.get_mut("socket_address") {
                let host = socket.get("address").and_then(Value::as_str).unwrap_or("");
                let port = socket
                    .get("port_value")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                let from = format!("{host}:{port}");
                let to = addresses
                    .iter()
                    .find(|(name, _)| *name == from)
                    .map(|(_, to)| *to)
                    .unwrap_or_else(|| panic!("the config has address {from}: say where it goes"));
                socket.insert("address".into(), to.ip().to_string().into());
                socket.insert("port_value".into(), u64::from(to.port()).into());
            }
            if let Some(Value::String(file)) = map.get_mut("filename")
                && file.ends_with(".wasm")
            {
                let name = Path::new(file.as_str())
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default()
                    .to_owned();
                let to = wasm
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, to)| to.display().to_string())
                    .unwrap_or_else(|| panic!("the config loads {file}: say which .wasm it is"));
                *file = to;
            }
            for (_, value) in map.iter_mut() {
                rewrite(value, addresses, wasm);
            }
        }
        Value::Sequence(items) => {
            for item in items {
                rewrite(item, addresses, wasm);
            }
        }
        _ => {}
    }
}

/// A loopback address on a port the kernel picks when Envoy binds it.
pub fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Redis, sluice-server behind a forwarder, and an upstream, for Envoys to use.
pub struct Backends {
    /// The redis-server.
    pub redis: RedisServer,
    /// The service the Envoys protect.
    pub upstream: Upstream,
    /// What Envoy connects to for sluice-server.
    pub proxy: ForwardingProxy,
    server: Option<RunningServer>,
    server_args: Vec<String>,
    /// Runs the server.
    pub runtime: tokio::runtime::Runtime,
}

impl Backends {
    /// Starts them, the server with `server_args` (sluice-server's own flags, besides
    /// `--redis` and [`PATIENT_REDIS`]).
    pub fn start(server_args: &[&str]) -> Backends {
        let redis = RedisServer::start().expect("redis-server must be installed");
        let runtime = runtime();
        let server_args: Vec<String> = server_args.iter().map(|s| (*s).to_owned()).collect();
        let server = spawn_server(&runtime, &redis, &server_args);
        let proxy = ForwardingProxy::start(server.addr()).expect("the forwarder");
        Backends {
            redis,
            upstream: Upstream::start().expect("the upstream"),
            proxy,
            server: Some(server),
            server_args,
            runtime,
        }
    }

    /// Where Envoy finds sluice-server (the forwarder).
    pub fn server_addr(&self) -> SocketAddr {
        self.proxy.addr()
    }

    /// Stops sluice-server: connections to it are refused from now on.
    pub fn stop_server(&mut self) {
        if let Some(server) = self.server.take() {
            self.runtime
                .block_on(server.stop())
                .expect("the server stops");
        }
    }

    /// Starts sluice-server again (on a new port, which the forwarder is pointed at).
    pub fn restart_server(&mut self) {
        self.stop_server();
        let server = spawn_server(&self.runtime, &self.redis, &self.server_args);
        self.proxy.retarget(server.addr());
        self.server = Some(server);
    }
}

impl Drop for Backends {
    fn drop(&mut self) {
        self.stop_server();
    }
}

fn spawn_server(
    runtime: &tokio::runtime::Runtime,
    redis: &RedisServer,
    args: &[String],
) -> RunningServer {
    let args = Args::try_parse_from(
        ["sluice-server", "--redis", &redis.url()]
            .into_iter()
            .chain(PATIENT_REDIS.iter().copied())
            .map(str::to_owned)
            .chain(args.iter().cloned()),
    )
    .expect("sluice-server's flags");
    let config = ServerConfig::try_from(&args).expect("sluice-server's settings");
    runtime
        .block_on(sluice_server::spawn(config, any_port()))
        .expect("sluice-server starts")
}

/// The flags every [`Backends`]' server takes: the tests in Envoy are of what is decided, not
/// how fast, so Redis is given two seconds a call, not production's 100 ms. Tests run beside
/// others on two busy cores, where a call past 100 ms (CI saw one in a million requests, and
/// two in 17,863) is the machine's doing, and would fail a request the test means to see
/// decided. None of them makes Redis slow: those that take it away kill it, which fails a
/// call at once.
pub const PATIENT_REDIS: &[&str] = &["--redis-timeout", "2s"];

/// Which of sluice's two builds of its filter an Envoy runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// The proxy-wasm filter, `sluice_filter.wasm`, in V8.
    Wasm,
    /// The native dynamic module, `libsluice_module.so`.
    Module,
}

impl Way {
    /// The prefix Envoy shows the filter's own counters under.
    pub fn stat_prefix(self) -> &'static str {
        match self {
            Way::Wasm => "wasmcustom.",
            Way::Module => "dynamicmodulescustom.",
        }
    }

    /// The filter state that holds the decision record.
    pub fn decision_state(self) -> &'static str {
        match self {
            Way::Wasm => "wasm.sluice.decision",
            Way::Module => "sluice.decision",
        }
    }
}

/// Starts Envoy on `config` with `workers` workers (sluice's module, if it loads it, built).
pub fn start_envoy(config: &str, workers: usize) -> Envoy {
    try_start_envoy(config, workers).expect("Envoy starts with the filter")
}

/// As [`start_envoy`], or why Envoy would not start.
pub fn try_start_envoy(config: &str, workers: usize) -> Result<Envoy, HarnessError> {
    if config.contains("dynamic_module_config") {
        let module = sluice_harness::module_dir().join("libsluice_module.so");
        assert!(
            module.exists(),
            "{} is not built: run `make module` (make test does it)",
            module.display()
        );
    }
    Envoy::start(config, workers)
}

/// sluice's filter as an Envoy config gives it: the .wasm (a wasm plugin) or the module.
#[derive(Debug, Clone)]
pub struct Plugin {
    /// The build of the filter.
    pub way: Way,
    /// The .wasm file.
    pub wasm: PathBuf,
    /// The plugin's `name`, `root_id`, and its VM's `vm_id`.
    pub names: [String; 3],
    /// The plugin configuration.
    pub configuration: String,
    /// The VM configuration, if any.
    pub vm_configuration: Option<String>,
    /// `FAIL_CLOSED`, `FAIL_OPEN` or `FAIL_RELOAD`.
    pub failure_policy: String,
    /// The cluster its callouts name.
    pub callout_cluster: String,
    /// Whether that cluster speaks HTTP/2 (sluice-server) or HTTP/1.1 (the test upstream).
    pub callout_http2: bool,
}

impl Plugin {
    /// sluice's filter with `policy`, as `envoy/envoy.yaml` names it, failing closed.
    pub fn sluice(policy: &str) -> Plugin {
        Plugin {
            way: Way::Wasm,
            wasm: crate::filter_wasm_path(),
            names: ["sluice", "sluice", "sluice"].map(str::to_owned),
            configuration: policy.to_owned(),
            vm_configuration: None,
            failure_policy: "FAIL_CLOSED".to_owned(),
            callout_cluster: "sluice".to_owned(),
            callout_http2: true,
        }
    }

    /// The probe filter with `script` as its VM and plugin configuration, named as the
    /// simulator's probe tests name it (`tests/src/probe.rs`).
    pub fn probe(script: &str) -> Plugin {
        Plugin {
            way: Way::Wasm,
            wasm: crate::probe::probe_wasm_path(),
            names: ["probe-plugin", "probe-root", "probe"].map(str::to_owned),
            configuration: script.to_owned(),
            vm_configuration: Some(script.to_owned()),
            failure_policy: "FAIL_CLOSED".to_owned(),
            callout_cluster: "limits".to_owned(),
            callout_http2: false,
        }
    }

    /// The same filter, in the build `way`.
    pub fn via(mut self, way: Way) -> Plugin {
        self.way = way;
        self
    }

    /// The same, with another failure policy.
    pub fn failing(mut self, failure_policy: &str) -> Plugin {
        self.failure_policy = failure_policy.to_owned();
        self
    }
}

/// `plugin`'s `typed_config`: JSON, which is also YAML wherever a value goes.
pub fn plugin_typed_config(plugin: &Plugin) -> serde_json::Value {
    let string_value = |value: &str| serde_json::json!({"@type": "type.googleapis.com/google.protobuf.StringValue", "value": value});
    let [name, root_id, vm_id] = &plugin.names;
    match plugin.way {
        Way::Wasm => {
            let mut vm_config = serde_json::json!({
                "vm_id": vm_id,
                "runtime": "envoy.wasm.runtime.v8",
                "code": {"local": {"filename": plugin.wasm}},
            });
            if let Some(configuration) = &plugin.vm_configuration {
                vm_config["configuration"] = string_value(configuration);
            }
            serde_json::json!({
                "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                "config": {
                    "name": name,
                    "root_id": root_id,
                    "failure_policy": plugin.failure_policy,
                    "vm_config": vm_config,
                    "configuration": string_value(&plugin.configuration),
                },
            })
        }
        Way::Module => sluice_harness::dynamic_module_typed_config(
            name,
            "sluice_module",
            &plugin.configuration,
        ),
    }
}

/// A minimal Envoy config around `plugin`: listener `ingress` on a free port, the plugin, the
/// router to `upstream`, and the plugin's callout cluster (HTTP/2) at `server`; the access log
/// (see [`ACCESS_LOG`]) has a line a request, its status and sluice's decision record.
pub fn plugin_config(plugin: &Plugin, server: SocketAddr, upstream: SocketAddr) -> String {
    let filter = sluice_harness::http_filter(&plugin.names[0], &plugin_typed_config(plugin));
    config_around(&filter, plugin, server, upstream)
}

/// [`plugin_config`] with the plugin's configuration discovered (ECDS, as Istio and Envoy
/// Gateway push a filter's configuration) from file `resource`, which [`publish_discovered`]
/// writes: Envoy takes each new version of the file as the filter's new configuration.
pub fn discovered_plugin_config(
    plugin: &Plugin,
    server: SocketAddr,
    upstream: SocketAddr,
    resource: &Path,
) -> String {
    let type_url = plugin_typed_config(plugin)["@type"].clone();
    let filter = format!(
        r#"
          - name: {name}
            config_discovery:
              config_source:
                path_config_source: {{path: {path}}}
                resource_api_version: V3
              type_urls: [{type_url}]"#,
        name = plugin.names[0],
        path = serde_json::Value::from(resource.display().to_string()),
    );
    // A discovered configuration is asked for by a node, which Envoy then requires.
    format!(
        "node: {{id: sluice-test, cluster: sluice-test}}\n{}",
        config_around(&filter, plugin, server, upstream)
    )
}

/// Writes `plugin`'s configuration to `resource` for [`discovered_plugin_config`]'s Envoy,
/// whole at once (a file moved into place), as Envoy's file watch asks.
pub fn publish_discovered(plugin: &Plugin, resource: &Path) {
    let resources = serde_json::json!({"resources": [{
        "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
        "name": plugin.names[0],
        "typed_config": plugin_typed_config(plugin),
    }]});
    let staged = resource.with_extension("staged");
    std::fs::write(&staged, resources.to_string()).expect("the staged configuration");
    std::fs::rename(&staged, resource).expect("the configuration moved into place");
}

/// The Envoy config of [`plugin_config`] with `filter` (a YAML list item) for the plugin.
fn config_around(
    filter: &str,
    plugin: &Plugin,
    server: SocketAddr,
    upstream: SocketAddr,
) -> String {
    format!(
        r#"
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
static_resources:
  listeners:
  - name: ingress
    address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          use_remote_address: true
          # One line a request: its status and the filter's decision record.
          access_log:
          - name: envoy.access_loggers.file
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: {access_log}
              log_format:
                text_format_source:
                  inline_string: "%RESPONSE_CODE% %FILTER_STATE({decision_state}:PLAIN)%\n"
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: upstream}}
          http_filters:{filter}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: {callout_cluster}
    type: STATIC
    connect_timeout: 0.25s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{{callout_protocol}: {{}}}}
    load_assignment:
      cluster_name: {callout_cluster}
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: {server_ip}, port_value: {server_port}}}}}}}
  - name: upstream
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: {upstream_ip}, port_value: {upstream_port}}}}}}}
"#,
        decision_state = plugin.way.decision_state(),
        callout_cluster = plugin.callout_cluster,
        callout_protocol = if plugin.callout_http2 {
            "http2_protocol_options"
        } else {
            "http_protocol_options"
        },
        access_log = ACCESS_LOG,
        server_ip = server.ip(),
        server_port = server.port(),
        upstream_ip = upstream.ip(),
        upstream_port = upstream.port(),
    )
}

/// GETs `path` through `envoy`'s listener `ingress`, on a new connection.
pub fn get(envoy: &Envoy, path: &str, headers: &[(&str, &str)]) -> Answer {
    let ingress = envoy.listener("ingress").expect("listener ingress");
    http::get(ingress, path, headers).expect("an answer from Envoy")
}

/// Sends `count` requests from `threads` threads at once (each on its own connection), and
/// returns every answer.
pub fn burst(
    envoy: &Envoy,
    path: &str,
    headers: &[(&str, &str)],
    count: usize,
    threads: usize,
) -> Vec<Answer> {
    let ingress = envoy.listener("ingress").expect("listener ingress");
    let per_thread = count.div_ceil(threads.max(1));
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let n = per_thread.min(count.saturating_sub(t * per_thread));
                scope.spawn(move || {
                    (0..n)
                        .map(|_| http::get(ingress, path, headers).expect("an answer from Envoy"))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a sending thread"))
            .collect()
    })
}

/// How many of `answers` had status `status`.
pub fn count_status(answers: &[Answer], status: u16) -> usize {
    answers.iter().filter(|a| a.status == status).count()
}

/// Polls `check` every 20 ms until it holds, for at most `within`.
pub fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(
            started.elapsed() < within,
            "not within {:.1}s: {what}",
            within.as_secs_f64()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The log format of an Envoy hosting the probe: the thread, the level, the message.
const PROBE_LOG_FORMAT: &str = "%t|%l|%v";

/// The probe filter (`tests/probe`) in a real Envoy, and what it logged: the same events
/// [`crate::probe::Probe`] reads from the simulator, so the two can be compared field by field.
pub struct EnvoyProbe {
    /// The Envoy.
    pub envoy: Envoy,
}

impl EnvoyProbe {
    /// Starts Envoy with `workers` workers and the probe running `script`, its callouts'
    /// cluster `limits` at `server`, its upstream at `upstream`.
    pub fn start(
        plugin: &Plugin,
        workers: usize,
        server: SocketAddr,
        upstream: SocketAddr,
    ) -> Result<EnvoyProbe, sluice_harness::HarnessError> {
        let config = plugin_config(plugin, server, upstream);
        let envoy = Envoy::start_with(&config, workers, &["--log-format", PROBE_LOG_FORMAT])?;
        Ok(EnvoyProbe { envoy })
    }

    /// Each line of Envoy's log in [`PROBE_LOG_FORMAT`]: thread, level, message.
    fn log_lines(&self) -> Vec<(String, String, String)> {
        self.envoy
            .log()
            .lines()
            .filter_map(|line| {
                let (thread, rest) = line.split_once('|')?;
                let (level, message) = rest.split_once('|')?;
                Some((thread.to_owned(), level.to_owned(), message.to_owned()))
            })
            .collect()
    }

    /// The lines Envoy logged at `level` (`info`, `error`, ...), message only.
    pub fn lines_at(&self, level: &str) -> Vec<String> {
        self.log_lines()
            .into_iter()
            .filter_map(|(_, at, message)| (at == level).then_some(message))
            .collect()
    }

    /// Everything the probe logged, oldest first. Each VM's thread is numbered as the
    /// simulator numbers workers: the canary, on the main thread, first logs are
    /// [`crate::probe::CANARY`], then workers 0, 1, ... in the order they first logged.
    pub fn events(&self) -> Vec<crate::probe::Event> {
        let mut threads: Vec<String> = Vec::new();
        self.log_lines()
            .into_iter()
            .filter_map(|(thread, _, message)| {
                // `wasm log <root id> <vm id>: {...}`, or `wasm log: {...}` outside any
                // context (`_initialize`).
                let rest = message.strip_prefix("wasm log")?;
                let fields: serde_json::Value =
                    serde_json::from_str(&rest[rest.find('{')?..]).ok()?;
                fields.get("event")?;
                let index = match threads.iter().position(|t| *t == thread) {
                    Some(i) => i,
                    None => {
                        threads.push(thread);
                        threads.len() - 1
                    }
                };
                let worker = if index == 0 {
                    crate::probe::CANARY
                } else {
                    index - 1
                };
                Some(crate::probe::Event { worker, fields })
            })
            .collect()
    }
}

/// Certificates for mutual TLS between Envoy and sluice-server, made on the spot in a
/// directory of their own: an authority, the server's (for `sluice-server`) and Envoy's (for
/// `envoy.internal`).
pub struct MutualTls {
    dir: tempfile::TempDir,
}

impl MutualTls {
    /// Makes them.
    pub fn new() -> MutualTls {
        let dir = tempfile::tempdir().expect("a directory");
        sluice_harness::certs::make_certificates(
            dir.path(),
            "ca",
            &[
                ("server", &["sluice-server"]),
                ("envoy", &["envoy.internal"]),
            ],
        );
        MutualTls { dir }
    }

    fn file(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// sluice-server's flags: TLS on, Envoy's certificate required.
    pub fn server_args(&self) -> Vec<String> {
        [
            ("--tls-cert", self.file("server.crt")),
            ("--tls-key", self.file("server.key")),
            ("--tls-client-ca", self.file("ca.crt")),
            ("--tls-client-san", "envoy.internal".to_owned()),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_owned(), value])
        .collect()
    }

    /// `config` (Envoy YAML) with cluster `cluster` speaking TLS to sluice-server, with the
    /// transport socket `docs/from-envoy-ratelimit.md` gives.
    pub fn on_cluster(&self, config: &str, cluster: &str) -> String {
        let transport_socket = format!(
            r#"
name: envoy.transport_sockets.tls
typed_config:
  "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
  sni: sluice-server
  common_tls_context:
    alpn_protocols: [h2]
    validation_context:
      trusted_ca: {{filename: {ca}}}
      match_typed_subject_alt_names:
      - san_type: DNS
        matcher: {{exact: sluice-server}}
    tls_certificates:
    - certificate_chain: {{filename: {cert}}}
      private_key: {{filename: {key}}}
"#,
            ca = self.file("ca.crt"),
            cert = self.file("envoy.crt"),
            key = self.file("envoy.key"),
        );
        let mut document: Value = serde_yaml_ng::from_str(config).expect("YAML");
        let clusters = document["static_resources"]["clusters"]
            .as_sequence_mut()
            .expect("clusters");
        let found = clusters
            .iter_mut()
            .find(|c| c["name"].as_str() == Some(cluster))
            .unwrap_or_else(|| panic!("no cluster {cluster}"));
        found.as_mapping_mut().expect("a cluster").insert(
            "transport_socket".into(),
            serde_yaml_ng::from_str(&transport_socket).expect("YAML"),
        );
        serde_yaml_ng::to_string(&document).expect("YAML")
    }
}

impl Default for MutualTls {
    fn default() -> MutualTls {
        MutualTls::new()
    }
}
