//! A route's `rate_limits`: each entry's actions make one descriptor of a request, as Envoy's
//! `RateLimitPolicyEntryImpl` makes it. An action that cannot produce its entry drops the whole
//! descriptor, unless it is told to skip itself when absent.

use std::net::IpAddr;

use serde_json::Value;

use super::matcher::{HeaderMatcher, QueryParameterMatcher};
use super::node::{ConfigError, Node};
use super::request::Downstream;

/// One entry of `rate_limits`.
#[derive(Debug, Clone)]
pub struct RateLimitEntry {
    /// Which filter stage takes it.
    pub stage: u64,
    /// The runtime key that turns it off (`ratelimit.<disable_key>.http_filter_enabled`).
    pub disable_key: Option<String>,
    actions: Vec<Action>,
}

/// What a descriptor is made from.
#[derive(Debug, Clone)]
enum Action {
    SourceCluster,
    DestinationCluster,
    RequestHeaders {
        header_name: String,
        descriptor_key: String,
        skip_if_absent: bool,
    },
    RemoteAddress,
    MaskedRemoteAddress {
        v4_prefix_len: u8,
        v6_prefix_len: u8,
    },
    GenericKey {
        descriptor_key: String,
        descriptor_value: String,
    },
    HeaderValueMatch {
        descriptor_key: String,
        descriptor_value: String,
        expect_match: bool,
        headers: Vec<HeaderMatcher>,
    },
    QueryParameters {
        name: String,
        descriptor_key: String,
        skip_if_absent: bool,
    },
    QueryParameterValueMatch {
        descriptor_key: String,
        descriptor_value: String,
        expect_match: bool,
        parameters: Vec<QueryParameterMatcher>,
    },
    /// Route metadata (`metadata` with `source: ROUTE_ENTRY`): known from the configuration.
    RouteMetadata {
        descriptor_key: String,
        filter: String,
        path: Vec<String>,
        default_value: String,
        skip_if_absent: bool,
    },
}

/// The action names the simulator models, in the order the issue lists them.
pub const MODELLED_ACTIONS: &[&str] = &[
    "request_headers",
    "remote_address",
    "generic_key",
    "header_value_match",
    "destination_cluster",
    "source_cluster",
    "masked_remote_address",
    "query_parameters",
    "query_parameter_value_match",
    "metadata",
];

/// What one request is, for the actions: the request, its route's cluster and metadata, and
/// the Envoy's own cluster name.
pub struct ActionInputs<'a> {
    /// The request.
    pub request: &'a Downstream<'a>,
    /// The cluster its route sends it to (`None` for a cluster chosen by header or weight).
    pub route_cluster: Option<&'a str>,
    /// Its route's `metadata`.
    pub route_metadata: Option<&'a Value>,
    /// `node.cluster`.
    pub local_cluster: &'a str,
}

impl RateLimitEntry {
    pub(crate) fn parse(node: &Node<'_>) -> Result<RateLimitEntry, ConfigError> {
        node.only(&["stage", "disable_key", "actions"], "a rate limit entry")?;
        let actions = node
            .list("actions")?
            .iter()
            .map(Action::parse)
            .collect::<Result<Vec<_>, _>>()?;
        if actions.is_empty() {
            return Err(node.error("a rate limit entry needs at least one action"));
        }
        Ok(RateLimitEntry {
            stage: node.u64("stage")?.unwrap_or(0),
            disable_key: node
                .string("disable_key")?
                .filter(|k| !k.is_empty())
                .map(str::to_owned),
            actions,
        })
    }

    /// The descriptor's (key, value) entries, or `None` when an action drops it.
    pub fn descriptor(&self, inputs: &ActionInputs<'_>) -> Option<Vec<(String, String)>> {
        let mut entries = Vec::with_capacity(self.actions.len());
        for action in &self.actions {
            match action.entry(inputs) {
                Produced::Entry(key, value) => entries.push((key, value)),
                Produced::Skip => {}
                Produced::Drop => return None,
            }
        }
        Some(entries)
    }
}

enum Produced {
    Entry(String, String),
    /// Nothing, and the descriptor goes on.
    Skip,
    /// The descriptor is not sent.
    Drop,
}

impl Produced {
    fn skip_or_drop(skip_if_absent: bool) -> Produced {
        if skip_if_absent {
            Produced::Skip
        } else {
            Produced::Drop
        }
    }
}

fn key_or(node: &Node<'_>, default: &str) -> Result<String, ConfigError> {
    Ok(node
        .string("descriptor_key")?
        .filter(|k| !k.is_empty())
        .unwrap_or(default)
        .to_owned())
}

fn required_string(node: &Node<'_>, field: &str) -> Result<String, ConfigError> {
    node.string(field)?
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| node.error(format!("`{field}` is required here")))
}

impl Action {
    fn parse(node: &Node<'_>) -> Result<Action, ConfigError> {
        let (name, body) = match node.value.as_object().map(|o| o.len()) {
            Some(1) => {
                let (name, _) = node
                    .value
                    .as_object()
                    .and_then(|o| o.iter().next())
                    .ok_or_else(|| node.error("an action is a mapping of one name"))?;
                (name.as_str(), node.required(name)?)
            }
            _ => {
                return Err(
                    node.error("an action is a mapping of one name, as `remote_address: {}`")
                );
            }
        };
        let action = match name {
            "source_cluster" => Action::SourceCluster,
            "destination_cluster" => Action::DestinationCluster,
            "remote_address" => Action::RemoteAddress,
            "request_headers" => {
                body.only(
                    &["header_name", "descriptor_key", "skip_if_absent"],
                    "request_headers",
                )?;
                Action::RequestHeaders {
                    header_name: required_string(&body, "header_name")?.to_ascii_lowercase(),
                    descriptor_key: required_string(&body, "descriptor_key")?,
                    skip_if_absent: body.bool("skip_if_absent")?.unwrap_or(false),
                }
            }
            "masked_remote_address" => {
                body.only(
                    &["v4_prefix_mask_len", "v6_prefix_mask_len"],
                    "masked_remote_address",
                )?;
                let length = |field: &str, max: u8| -> Result<u8, ConfigError> {
                    match body.u64(field)? {
                        None => Ok(max),
                        Some(n) if n <= u64::from(max) => Ok(n as u8),
                        Some(_) => Err(body.error(format!("`{field}` is at most {max}"))),
                    }
                };
                Action::MaskedRemoteAddress {
                    v4_prefix_len: length("v4_prefix_mask_len", 32)?,
                    v6_prefix_len: length("v6_prefix_mask_len", 128)?,
                }
            }
            "generic_key" => {
                body.only(&["descriptor_key", "descriptor_value"], "generic_key")?;
                Action::GenericKey {
                    descriptor_key: key_or(&body, "generic_key")?,
                    descriptor_value: required_string(&body, "descriptor_value")?,
                }
            }
            "header_value_match" => {
                body.only(
                    &[
                        "descriptor_key",
                        "descriptor_value",
                        "expect_match",
                        "headers",
                    ],
                    "header_value_match",
                )?;
                Action::HeaderValueMatch {
                    descriptor_key: key_or(&body, "header_match")?,
                    descriptor_value: required_string(&body, "descriptor_value")?,
                    expect_match: body.bool("expect_match")?.unwrap_or(true),
                    headers: body
                        .list("headers")?
                        .iter()
                        .map(HeaderMatcher::parse)
                        .collect::<Result<_, _>>()?,
                }
            }
            "query_parameters" => {
                body.only(
                    &["query_parameter_name", "descriptor_key", "skip_if_absent"],
                    "query_parameters",
                )?;
                Action::QueryParameters {
                    name: required_string(&body, "query_parameter_name")?,
                    descriptor_key: required_string(&body, "descriptor_key")?,
                    skip_if_absent: body.bool("skip_if_absent")?.unwrap_or(false),
                }
            }
            "query_parameter_value_match" => {
                body.only(
                    &[
                        "descriptor_key",
                        "descriptor_value",
                        "expect_match",
                        "query_parameters",
                    ],
                    "query_parameter_value_match",
                )?;
                Action::QueryParameterValueMatch {
                    descriptor_key: key_or(&body, "query_match")?,
                    descriptor_value: required_string(&body, "descriptor_value")?,
                    expect_match: body.bool("expect_match")?.unwrap_or(true),
                    parameters: body
                        .list("query_parameters")?
                        .iter()
                        .map(QueryParameterMatcher::parse)
                        .collect::<Result<_, _>>()?,
                }
            }
            "metadata" => Action::parse_metadata(&body)?,
            "dynamic_metadata" => {
                return Err(body.error(
                    "dynamic metadata is set by other filters as Envoy runs, and a trace does not carry it; \
                     the simulator cannot say what this action would send",
                ));
            }
            other => {
                return Err(node.error(format!(
                    "the simulator does not model the action `{other}`; it models {}",
                    MODELLED_ACTIONS.join(", ")
                )));
            }
        };
        Ok(action)
    }

    fn parse_metadata(body: &Node<'_>) -> Result<Action, ConfigError> {
        body.only(
            &[
                "descriptor_key",
                "metadata_key",
                "default_value",
                "source",
                "skip_if_absent",
            ],
            "metadata",
        )?;
        let source = body.string("source")?.unwrap_or("DYNAMIC");
        if source != "ROUTE_ENTRY" {
            return Err(body.error(format!(
                "metadata from `source: {source}` is set by other filters as Envoy runs, and a trace does not \
                 carry it; the simulator models `source: ROUTE_ENTRY` (the route's own metadata)"
            )));
        }
        let key = body.required("metadata_key")?;
        key.only(&["key", "path"], "a metadata key")?;
        let path = key
            .list("path")?
            .iter()
            .map(|segment| {
                segment.only(&["key"], "a metadata path segment")?;
                required_string(segment, "key")
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Action::RouteMetadata {
            descriptor_key: required_string(body, "descriptor_key")?,
            filter: required_string(&key, "key")?,
            path,
            default_value: body.string("default_value")?.unwrap_or_default().to_owned(),
            skip_if_absent: body.bool("skip_if_absent")?.unwrap_or(false),
        })
    }

    fn entry(&self, inputs: &ActionInputs<'_>) -> Produced {
        let request = inputs.request;
        match self {
            Action::SourceCluster => {
                Produced::Entry("source_cluster".into(), inputs.local_cluster.into())
            }
            Action::DestinationCluster => match inputs.route_cluster {
                Some(cluster) => Produced::Entry("destination_cluster".into(), cluster.into()),
                None => Produced::Drop,
            },
            Action::RemoteAddress => {
                Produced::Entry("remote_address".into(), request.remote.to_string())
            }
            Action::MaskedRemoteAddress {
                v4_prefix_len,
                v6_prefix_len,
            } => Produced::Entry(
                "masked_remote_address".into(),
                masked(request.remote, *v4_prefix_len, *v6_prefix_len),
            ),
            Action::RequestHeaders {
                header_name,
                descriptor_key,
                skip_if_absent,
            } => match request.header_first(header_name) {
                Some(value) => Produced::Entry(descriptor_key.clone(), value.to_owned()),
                None => Produced::skip_or_drop(*skip_if_absent),
            },
            Action::GenericKey {
                descriptor_key,
                descriptor_value,
            } => Produced::Entry(descriptor_key.clone(), descriptor_value.clone()),
            Action::HeaderValueMatch {
                descriptor_key,
                descriptor_value,
                expect_match,
                headers,
            } => {
                if *expect_match == headers.iter().all(|h| h.matches(request)) {
                    Produced::Entry(descriptor_key.clone(), descriptor_value.clone())
                } else {
                    Produced::Drop
                }
            }
            Action::QueryParameters {
                name,
                descriptor_key,
                skip_if_absent,
            } => match request.query_parameter(name) {
                Some(value) => Produced::Entry(descriptor_key.clone(), value),
                None => Produced::skip_or_drop(*skip_if_absent),
            },
            Action::QueryParameterValueMatch {
                descriptor_key,
                descriptor_value,
                expect_match,
                parameters,
            } => {
                if *expect_match == parameters.iter().all(|p| p.matches(request)) {
                    Produced::Entry(descriptor_key.clone(), descriptor_value.clone())
                } else {
                    Produced::Drop
                }
            }
            Action::RouteMetadata {
                descriptor_key,
                filter,
                path,
                default_value,
                skip_if_absent,
            } => {
                let found = inputs
                    .route_metadata
                    .and_then(|m| m.get("filter_metadata"))
                    .and_then(|m| m.get(filter))
                    .and_then(|m| path.iter().try_fold(m, |v, k| v.get(k)))
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty());
                match (found, default_value.is_empty()) {
                    (Some(value), _) => Produced::Entry(descriptor_key.clone(), value.to_owned()),
                    (None, false) => Produced::Entry(descriptor_key.clone(), default_value.clone()),
                    (None, true) => Produced::skip_or_drop(*skip_if_absent),
                }
            }
        }
    }
}

/// `address/len` with the host bits cleared, as Envoy's `CidrRange::asString` writes it.
fn masked(address: IpAddr, v4_prefix_len: u8, v6_prefix_len: u8) -> String {
    match address {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let mask = u32::MAX
                .checked_shl(32 - u32::from(v4_prefix_len))
                .unwrap_or(0);
            format!("{}/{v4_prefix_len}", std::net::Ipv4Addr::from(bits & mask))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let mask = u128::MAX
                .checked_shl(128 - u32::from(v6_prefix_len))
                .unwrap_or(0);
            format!("{}/{v6_prefix_len}", std::net::Ipv6Addr::from(bits & mask))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_masked_address_keeps_the_prefix_and_names_its_length() {
        let v4: IpAddr = "203.0.113.77".parse().unwrap();
        assert_eq!(masked(v4, 24, 128), "203.0.113.0/24");
        assert_eq!(masked(v4, 32, 128), "203.0.113.77/32");
        assert_eq!(masked(v4, 0, 128), "0.0.0.0/0");
        let v6: IpAddr = "2001:db8:1:2::5".parse().unwrap();
        assert_eq!(masked(v6, 32, 64), "2001:db8:1:2::/64");
    }
}
