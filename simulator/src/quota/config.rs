//! The configuration of Envoy's `rate_limit_quota` filter, read for what the model does: the
//! domain, the `bucket_matchers` that give each request its bucket settings, and each
//! settings' bucket id builder and behaviours.

use crate::native::config::{address_policy, manager_with};
use crate::native::matcher::StringMatcher;
use crate::native::node::{ConfigError, Node, parse_yaml};
use crate::native::request::{AddressPolicy, Downstream};

/// The filter's type.
const QUOTA_FILTER: &str = "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig";
const BUCKET_SETTINGS: &str = "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings";
const HEADER_INPUT: &str = "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput";
const SOURCE_IP_INPUT: &str =
    "type.googleapis.com/envoy.extensions.matching.common_inputs.network.v3.SourceIPInput";

/// What the quota filter of one listener does.
#[derive(Debug, Clone)]
pub struct QuotaConfig {
    /// The domain its reports name.
    pub domain: String,
    /// The cluster of the quota service.
    pub cluster: String,
    /// How the client's address is found.
    pub addresses: AddressPolicy,
    matcher: Matcher,
    /// The bucket settings the matcher's actions name, by index.
    pub settings: Vec<BucketSettings>,
}

/// A matcher input the model can evaluate from a trace.
#[derive(Debug, Clone)]
enum Input {
    /// A request header (repeated values joined by `,`).
    Header(String),
    /// The client address the connection manager settled on.
    SourceIp,
}

#[derive(Debug, Clone)]
enum Predicate {
    Single { input: Input, value: StringMatcher },
    And(Vec<Predicate>),
    Or(Vec<Predicate>),
    Not(Box<Predicate>),
}

#[derive(Debug, Clone)]
enum OnMatch {
    /// Bucket settings, by index.
    Settings(usize),
    Matcher(Box<Matcher>),
}

#[derive(Debug, Clone)]
struct Matcher {
    list: Vec<(Predicate, OnMatch)>,
    on_no_match: Option<OnMatch>,
}

/// A blanket rule (`ALLOW_ALL`, `DENY_ALL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blanket {
    /// Every request passes.
    AllowAll,
    /// Every request is denied.
    DenyAll,
}

/// What applies once an assignment's time to live has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// `no_assignment_behavior`, as for a bucket never assigned.
    NoAssignment,
    /// A blanket rule for a while after the lapse, then `no_assignment_behavior`.
    Fallback {
        /// The rule.
        rule: Blanket,
        /// For how long after the lapse.
        timeout_s: u64,
    },
    /// The last assignment goes on being enforced.
    ReuseLast,
}

/// One `RateLimitQuotaBucketSettings`.
#[derive(Debug, Clone)]
pub struct BucketSettings {
    /// The action's name, for messages.
    pub name: String,
    id: Vec<(String, IdValue)>,
    /// The status of a denied request.
    pub denied_status: u16,
    /// What decides a bucket with no assignment.
    pub no_assignment: Blanket,
    /// What decides a bucket whose assignment lapsed.
    pub expired: Expired,
}

#[derive(Debug, Clone)]
enum IdValue {
    Fixed(String),
    Input(Input),
}

impl QuotaConfig {
    /// Reads a bootstrap configuration (YAML or JSON).
    pub fn parse(text: &str) -> Result<QuotaConfig, ConfigError> {
        let value = parse_yaml(text)?;
        let root = Node::root(&value);
        let (_, manager) = manager_with(&root, QUOTA_FILTER, "the quota filter")?;
        let filters: Vec<Node<'_>> = manager
            .list("http_filters")?
            .into_iter()
            .filter(|f| {
                f.value
                    .pointer("/typed_config/@type")
                    .and_then(|t| t.as_str())
                    == Some(QUOTA_FILTER)
            })
            .collect();
        if filters.len() > 1 {
            return Err(
                filters[1].error("a second quota filter in one chain; the simulator models one")
            );
        }
        let filter = filters
            .first()
            .ok_or_else(|| manager.error("no quota filter"))?
            .required("typed_config")?;
        filter.only(
            &["@type", "domain", "rlqs_server", "bucket_matchers"],
            "the quota filter",
        )?;
        let cluster = filter
            .required("rlqs_server")?
            .required("envoy_grpc")?
            .string("cluster_name")?
            .ok_or_else(|| filter.error("`rlqs_server.envoy_grpc.cluster_name` is required here"))?
            .to_owned();
        let mut settings = Vec::new();
        let matcher = Matcher::parse(&filter.required("bucket_matchers")?, &mut settings)?;
        Ok(QuotaConfig {
            domain: filter
                .string("domain")?
                .ok_or_else(|| filter.error("`domain` is required here"))?
                .to_owned(),
            cluster,
            addresses: address_policy(&manager)?,
            matcher,
            settings,
        })
    }

    /// The bucket `request` falls in: its settings (by index) and its id, or `None` when no
    /// matcher gives it one, or an input its id is built from is absent.
    pub fn bucket(&self, request: &Downstream<'_>) -> Option<(usize, Vec<(String, String)>)> {
        let settings = self.matcher.evaluate(request)?;
        let id = self.settings[settings]
            .id
            .iter()
            .map(|(key, value)| {
                let value = match value {
                    IdValue::Fixed(text) => text.clone(),
                    IdValue::Input(input) => input.read(request)?,
                };
                Some((key.clone(), value))
            })
            .collect::<Option<Vec<_>>>()?;
        Some((settings, id))
    }
}

impl Input {
    fn parse(node: &Node<'_>) -> Result<Input, ConfigError> {
        let typed = node.required("typed_config")?;
        match typed.string("@type")? {
            Some(HEADER_INPUT) => {
                typed.only(&["@type", "header_name"], "a header input")?;
                Ok(Input::Header(
                    typed
                        .string("header_name")?
                        .ok_or_else(|| typed.error("`header_name` is required here"))?
                        .to_ascii_lowercase(),
                ))
            }
            Some(SOURCE_IP_INPUT) => Ok(Input::SourceIp),
            other => Err(typed.error(format!(
                "the simulator cannot evaluate the input `{}` from a trace; it reads {HEADER_INPUT} and {SOURCE_IP_INPUT}",
                other.unwrap_or("(no @type)")
            ))),
        }
    }

    fn read(&self, request: &Downstream<'_>) -> Option<String> {
        match self {
            Input::Header(name) => request.header_joined(name),
            Input::SourceIp => Some(request.remote.to_string()),
        }
    }
}

impl Predicate {
    fn parse(node: &Node<'_>) -> Result<Predicate, ConfigError> {
        let (kind, body) = node.one_of(
            &[
                "single_predicate",
                "and_matcher",
                "or_matcher",
                "not_matcher",
            ],
            "a predicate",
        )?;
        let list = |body: &Node<'_>| -> Result<Vec<Predicate>, ConfigError> {
            body.list("predicate")?
                .iter()
                .map(Predicate::parse)
                .collect()
        };
        Ok(match kind {
            "single_predicate" => {
                body.only(&["input", "value_match"], "a single predicate")?;
                Predicate::Single {
                    input: Input::parse(&body.required("input")?)?,
                    value: StringMatcher::parse(&body.required("value_match")?)?,
                }
            }
            "and_matcher" => Predicate::And(list(&body)?),
            "or_matcher" => Predicate::Or(list(&body)?),
            _ => Predicate::Not(Box::new(Predicate::parse(&body)?)),
        })
    }

    fn matches(&self, request: &Downstream<'_>) -> bool {
        match self {
            Predicate::Single { input, value } => {
                input.read(request).is_some_and(|v| value.matches(&v))
            }
            Predicate::And(all) => all.iter().all(|p| p.matches(request)),
            Predicate::Or(any) => any.iter().any(|p| p.matches(request)),
            Predicate::Not(inner) => !inner.matches(request),
        }
    }
}

impl OnMatch {
    fn parse(node: &Node<'_>, settings: &mut Vec<BucketSettings>) -> Result<OnMatch, ConfigError> {
        let (kind, body) = node.one_of(&["action", "matcher"], "an on_match")?;
        if kind == "matcher" {
            return Ok(OnMatch::Matcher(Box::new(Matcher::parse(&body, settings)?)));
        }
        settings.push(BucketSettings::parse(&body)?);
        Ok(OnMatch::Settings(settings.len() - 1))
    }

    fn evaluate(&self, request: &Downstream<'_>) -> Option<usize> {
        match self {
            OnMatch::Settings(index) => Some(*index),
            OnMatch::Matcher(inner) => inner.evaluate(request),
        }
    }
}

impl Matcher {
    fn parse(node: &Node<'_>, settings: &mut Vec<BucketSettings>) -> Result<Matcher, ConfigError> {
        node.only(
            &["matcher_list", "on_no_match"],
            "bucket_matchers (a matcher_tree is not modelled)",
        )?;
        let list = match node.field("matcher_list") {
            None => Vec::new(),
            Some(list) => list
                .list("matchers")?
                .iter()
                .map(|m| {
                    m.only(&["predicate", "on_match"], "a field matcher")?;
                    Ok((
                        Predicate::parse(&m.required("predicate")?)?,
                        OnMatch::parse(&m.required("on_match")?, settings)?,
                    ))
                })
                .collect::<Result<Vec<_>, ConfigError>>()?,
        };
        let on_no_match = node
            .field("on_no_match")
            .map(|n| OnMatch::parse(&n, settings))
            .transpose()?;
        Ok(Matcher { list, on_no_match })
    }

    /// The first matcher whose predicate matches decides; with none, `on_no_match`.
    fn evaluate(&self, request: &Downstream<'_>) -> Option<usize> {
        match self.list.iter().find(|(p, _)| p.matches(request)) {
            Some((_, on_match)) => on_match.evaluate(request),
            None => self.on_no_match.as_ref()?.evaluate(request),
        }
    }
}

impl BucketSettings {
    fn parse(action: &Node<'_>) -> Result<BucketSettings, ConfigError> {
        let name = action.string("name")?.unwrap_or_default().to_owned();
        let typed = action.required("typed_config")?;
        if typed.string("@type")? != Some(BUCKET_SETTINGS) {
            return Err(typed.error(format!("a quota filter's action is a {BUCKET_SETTINGS}")));
        }
        typed.only(
            &[
                "@type",
                "bucket_id_builder",
                "reporting_interval",
                "deny_response_settings",
                "no_assignment_behavior",
                "expired_assignment_behavior",
            ],
            "bucket settings",
        )?;
        let builder = typed
            .required("bucket_id_builder")?
            .required("bucket_id_builder")?;
        let id = builder
            .value
            .as_object()
            .ok_or_else(|| builder.error("must be a mapping of bucket id entries"))?
            .keys()
            .map(|key| {
                let value = builder.required(key)?;
                let (kind, body) =
                    value.one_of(&["string_value", "custom_value"], "a bucket id value")?;
                let value = match kind {
                    "string_value" => IdValue::Fixed(
                        body.value
                            .as_str()
                            .ok_or_else(|| body.error("must be a string"))?
                            .to_owned(),
                    ),
                    _ => IdValue::Input(Input::parse(&body)?),
                };
                Ok((key.clone(), value))
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let denied_status = match typed.field("deny_response_settings") {
            None => 429,
            Some(deny) => deny
                .field("http_status")
                .map(|s| s.u64("code"))
                .transpose()?
                .flatten()
                .map_or(Ok(429), |c| {
                    u16::try_from(c).map_err(|_| deny.error("not an HTTP status"))
                })?,
        };
        let no_assignment = match typed.field("no_assignment_behavior") {
            None => Blanket::AllowAll,
            Some(behaviour) => blanket(&behaviour.required("fallback_rate_limit")?)?,
        };
        let expired = match typed.field("expired_assignment_behavior") {
            None => Expired::NoAssignment,
            Some(behaviour) => {
                behaviour.only(
                    &[
                        "fallback_rate_limit",
                        "reuse_last_assignment",
                        "expired_assignment_behavior_timeout",
                    ],
                    "expired_assignment_behavior",
                )?;
                let timeout_s = behaviour
                    .string("expired_assignment_behavior_timeout")?
                    .and_then(|t| t.strip_suffix('s')?.parse::<f64>().ok())
                    .map_or(u64::MAX, |s| s as u64);
                match (
                    behaviour.field("fallback_rate_limit"),
                    behaviour.field("reuse_last_assignment"),
                ) {
                    (Some(fallback), None) => Expired::Fallback {
                        rule: blanket(&fallback)?,
                        timeout_s,
                    },
                    (None, Some(_)) => Expired::ReuseLast,
                    _ => {
                        return Err(behaviour.error(
                            "expired_assignment_behavior takes one of fallback_rate_limit, reuse_last_assignment",
                        ));
                    }
                }
            }
        };
        Ok(BucketSettings {
            name,
            id,
            denied_status,
            no_assignment,
            expired,
        })
    }
}

fn blanket(node: &Node<'_>) -> Result<Blanket, ConfigError> {
    match node.string("blanket_rule")? {
        Some("ALLOW_ALL") => Ok(Blanket::AllowAll),
        Some("DENY_ALL") => Ok(Blanket::DenyAll),
        _ => Err(node.error(
            "the model takes a `blanket_rule` of ALLOW_ALL or DENY_ALL here (Envoy 1.40 crashes on a token bucket fallback when a new bucket's first requests come together: docs/rlqs.md)",
        )),
    }
}
