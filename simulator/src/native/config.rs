//! The Envoy configuration a user deploys, read for what the native rate limit filter does:
//! the listener whose connection manager runs `envoy.filters.http.ratelimit`, its filters'
//! settings, its route table, and the runtime keys that turn entries off.

use std::collections::BTreeMap;
use std::time::Duration;

use super::node::{ConfigError, Node};
use super::request::AddressPolicy;
use super::route::RouteTable;

/// The connection manager's type.
const CONNECTION_MANAGER: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
/// The rate limit filter's type.
const RATE_LIMIT_FILTER: &str =
    "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit";

/// One `envoy.filters.http.ratelimit` in the chain.
#[derive(Debug, Clone)]
pub struct RateLimitFilter {
    /// Where it is, for messages.
    pub path: String,
    /// The domain its calls name.
    pub domain: String,
    /// Which `rate_limits` entries it takes.
    pub stage: u64,
    /// Deny (500) when the service fails, instead of letting the request through.
    pub failure_mode_deny: bool,
    /// How long a call may take (Envoy's default 20 ms).
    pub timeout: Duration,
    /// The status of a limited request (429 unless set).
    pub rate_limited_status: u16,
    /// The gRPC cluster the calls go to.
    pub cluster: String,
}

/// What the simulator replays through: one listener's connection manager.
#[derive(Debug, Clone)]
pub struct NativeConfig {
    /// The listener's name.
    pub listener: String,
    /// How the client's address is found.
    pub addresses: AddressPolicy,
    /// The rate limit filters, in chain order.
    pub filters: Vec<RateLimitFilter>,
    /// The routes.
    pub routes: RouteTable,
    /// `node.cluster`, which `source_cluster` sends.
    pub local_cluster: String,
    /// The bootstrap's static runtime layers, flattened to dotted keys.
    runtime: BTreeMap<String, serde_json::Value>,
}

impl NativeConfig {
    /// Reads a bootstrap configuration (YAML or JSON).
    pub fn parse(text: &str) -> Result<NativeConfig, ConfigError> {
        let value = super::node::parse_yaml(text)?;
        let root = Node::root(&value);
        let (listener, manager) = manager_with(&root, RATE_LIMIT_FILTER, "the rate limit filter")?;
        let route_config = manager.field("route_config").ok_or_else(|| {
            manager.error("the routes must be inline in `route_config` (the simulator does not fetch them over RDS)")
        })?;
        let filters = manager
            .list("http_filters")?
            .iter()
            .filter(|f| {
                f.value
                    .pointer("/typed_config/@type")
                    .and_then(|t| t.as_str())
                    == Some(RATE_LIMIT_FILTER)
            })
            .map(|f| RateLimitFilter::parse(&f.required("typed_config")?))
            .collect::<Result<Vec<_>, _>>()?;
        let mut runtime = BTreeMap::new();
        for layer in root
            .field("layered_runtime")
            .map(|r| r.list("layers"))
            .transpose()?
            .unwrap_or_default()
        {
            if let Some(layer) = layer.field("static_layer") {
                flatten(layer.value, String::new(), &mut runtime);
            }
        }
        Ok(NativeConfig {
            listener,
            addresses: address_policy(&manager)?,
            filters,
            routes: RouteTable::parse(&route_config)?,
            local_cluster: root
                .field("node")
                .map(|n| n.string("cluster"))
                .transpose()?
                .flatten()
                .unwrap_or_default()
                .to_owned(),
            runtime,
        })
    }

    /// Whether the entry with `disable_key` is on: `ratelimit.<disable_key>.http_filter_enabled`
    /// is a percentage, 100 unless the static runtime sets it; a fraction between 0 and 100
    /// would be a coin toss, which a replay refuses to guess at (taken as on, and said where it
    /// is read).
    pub fn entry_enabled(&self, disable_key: &str) -> bool {
        let key = format!("ratelimit.{disable_key}.http_filter_enabled");
        match self.runtime.get(&key) {
            None => true,
            Some(value) => percent(value).is_none_or(|p| p > 0.0),
        }
    }
}

/// The one listener whose connection manager runs an HTTP filter of type `filter_type`, and
/// that connection manager's configuration.
pub(crate) fn manager_with<'a>(
    root: &Node<'a>,
    filter_type: &str,
    what: &str,
) -> Result<(String, Node<'a>), ConfigError> {
    let mut found = Vec::new();
    for listener in root
        .field("static_resources")
        .map(|r| r.list("listeners"))
        .transpose()?
        .unwrap_or_default()
    {
        for chain in listener.list("filter_chains")? {
            for filter in chain.list("filters")? {
                let Some(typed) = filter.field("typed_config") else {
                    continue;
                };
                if typed.string("@type")? != Some(CONNECTION_MANAGER) {
                    continue;
                }
                let runs_it = typed.list("http_filters")?.iter().any(|f| {
                    f.value
                        .pointer("/typed_config/@type")
                        .and_then(|t| t.as_str())
                        == Some(filter_type)
                });
                if runs_it {
                    found.push((listener.string("name")?.unwrap_or("").to_owned(), typed));
                }
            }
        }
    }
    match found.len() {
        0 => Err(root.error(format!(
            "no listener's connection manager runs {what} ({filter_type})"
        ))),
        1 => Ok(found.remove(0)),
        _ => Err(found[1].1.error(format!(
            "a second connection manager runs {what}; the simulator replays one, so give a configuration with one"
        ))),
    }
}

/// The client address policy of a connection manager.
pub(crate) fn address_policy(manager: &Node<'_>) -> Result<AddressPolicy, ConfigError> {
    Ok(AddressPolicy {
        use_remote_address: manager.bool("use_remote_address")?.unwrap_or(false),
        xff_num_trusted_hops: manager
            .u64("xff_num_trusted_hops")?
            .unwrap_or(0)
            .try_into()
            .map_err(|_| manager.error("`xff_num_trusted_hops` is too large"))?,
    })
}

fn percent(value: &serde_json::Value) -> Option<f64> {
    if let Some(n) = value.as_f64() {
        return Some(n);
    }
    let numerator = value.get("numerator")?.as_f64()?;
    let denominator = match value.get("denominator").and_then(|d| d.as_str()) {
        None | Some("HUNDRED") => 100.0,
        Some("TEN_THOUSAND") => 10_000.0,
        Some(_) => 1_000_000.0,
    };
    Some(numerator * 100.0 / denominator)
}

/// A static runtime layer's nested keys as Envoy reads them (`a: {b: 1}` is `a.b`).
fn flatten(
    value: &serde_json::Value,
    prefix: String,
    out: &mut BTreeMap<String, serde_json::Value>,
) {
    match value.as_object() {
        Some(object) if !object.contains_key("numerator") => {
            for (key, inner) in object {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                flatten(inner, path, out);
            }
        }
        _ => {
            out.insert(prefix, value.clone());
        }
    }
}

impl RateLimitFilter {
    fn parse(node: &Node<'_>) -> Result<RateLimitFilter, ConfigError> {
        node.only(
            &[
                "@type",
                "domain",
                "stage",
                "request_type",
                "timeout",
                "failure_mode_deny",
                "rate_limit_service",
                "rate_limited_status",
                "enable_x_ratelimit_headers",
                "disable_x_envoy_ratelimited_header",
                "stat_prefix",
            ],
            "the rate limit filter",
        )?;
        let domain = node
            .string("domain")?
            .filter(|d| !d.is_empty())
            .ok_or_else(|| node.error("`domain` is required here"))?
            .to_owned();
        if let Some(kind) = node.string("request_type")?
            && kind != "both"
        {
            return Err(node
                .required("request_type")?
                .error(format!("a trace does not say whether a request was internal or external, so `request_type: {kind}` cannot be modelled; use `both`")));
        }
        let service = node.required("rate_limit_service")?;
        let cluster = service
            .required("grpc_service")?
            .required("envoy_grpc")?
            .string("cluster_name")?
            .ok_or_else(|| {
                service.error("`grpc_service.envoy_grpc.cluster_name` is required here")
            })?
            .to_owned();
        let timeout = match node.string("timeout")? {
            None => Duration::from_millis(20),
            Some(text) => parse_proto_duration(text).ok_or_else(|| ConfigError {
                path: format!("{}.timeout", node.path),
                reason: format!("`{text}` is not a duration such as 0.1s"),
            })?,
        };
        let rate_limited_status = match node.field("rate_limited_status") {
            None => 429,
            Some(status) => {
                let code = match status.string("code") {
                    Ok(Some(name)) => status_named(name).ok_or_else(|| {
                        status.error(format!(
                            "`{name}` is not a status code this model knows; give the number"
                        ))
                    })?,
                    _ => status.u64("code")?.unwrap_or(429),
                };
                // Envoy takes a code below 400 as 429.
                if code < 400 {
                    429
                } else {
                    u16::try_from(code).map_err(|_| status.error("not an HTTP status"))?
                }
            }
        };
        Ok(RateLimitFilter {
            path: node.path.clone(),
            domain,
            stage: node.u64("stage")?.unwrap_or(0),
            failure_mode_deny: node.bool("failure_mode_deny")?.unwrap_or(false),
            timeout,
            rate_limited_status,
            cluster,
        })
    }
}

/// `envoy.type.v3.StatusCode` names a limited request is commonly answered with.
fn status_named(name: &str) -> Option<u64> {
    Some(match name {
        "TooManyRequests" => 429,
        "ServiceUnavailable" => 503,
        "Forbidden" => 403,
        "BadRequest" => 400,
        "Unauthorized" => 401,
        "InternalServerError" => 500,
        "EnhanceYourCalm" => 420,
        _ => name.parse().ok()?,
    })
}

/// A protobuf `Duration` in its JSON form: seconds with an `s`, as `0.25s`.
fn parse_proto_duration(text: &str) -> Option<Duration> {
    let seconds: f64 = text.strip_suffix('s')?.parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds))
}
