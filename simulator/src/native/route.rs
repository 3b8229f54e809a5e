//! The connection manager's inline route table: which virtual host and route a request takes,
//! and so which `rate_limits` apply to it.

use regex::Regex;
use serde_json::Value;

use super::action::RateLimitEntry;
use super::matcher::{HeaderMatcher, QueryParameterMatcher, all_headers_match, safe_regex};
use super::node::{ConfigError, Node};
use super::request::Downstream;

/// `route_config`, inline.
#[derive(Debug, Clone)]
pub struct RouteTable {
    virtual_hosts: Vec<VirtualHost>,
}

#[derive(Debug, Clone)]
struct VirtualHost {
    domains: Vec<String>,
    routes: Vec<Route>,
    rate_limits: Vec<RateLimitEntry>,
}

/// One route.
#[derive(Debug, Clone)]
pub struct Route {
    path: PathMatch,
    case_sensitive: bool,
    headers: Vec<HeaderMatcher>,
    query_parameters: Vec<QueryParameterMatcher>,
    /// `None` for a direct response or a redirect, which the rate limit filter does not see
    /// (it has no route entry).
    pub cluster: Option<Option<String>>,
    rate_limits: Vec<RateLimitEntry>,
    include_vh_rate_limits: bool,
    /// `metadata`, for `metadata` actions with `source: ROUTE_ENTRY`.
    pub metadata: Option<Value>,
}

#[derive(Debug, Clone)]
enum PathMatch {
    Prefix(String),
    Path(String),
    Regex(Regex),
    SeparatedPrefix(String),
}

/// The route a request took and the `rate_limits` entries that apply to it, in Envoy's order:
/// the route's, then the virtual host's when the route includes them or has none.
pub struct Routed<'a> {
    /// The route.
    pub route: &'a Route,
    /// Its `rate_limits` entries and, when they apply, its virtual host's.
    pub entries: Vec<&'a RateLimitEntry>,
}

impl RouteTable {
    pub(crate) fn parse(node: &Node<'_>) -> Result<RouteTable, ConfigError> {
        let virtual_hosts = node
            .list("virtual_hosts")?
            .iter()
            .map(VirtualHost::parse)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RouteTable { virtual_hosts })
    }

    /// The route `request` takes and its rate limit entries, or `None` when no route matches
    /// or it has no route entry (Envoy then answers without the filter limiting it).
    pub fn route(&self, request: &Downstream<'_>) -> Option<Routed<'_>> {
        let host = self.virtual_host(&request.host())?;
        let route = host.routes.iter().find(|r| r.matches(request))?;
        route.cluster.as_ref()?;
        let mut entries: Vec<&RateLimitEntry> = route.rate_limits.iter().collect();
        if route.include_vh_rate_limits || route.rate_limits.is_empty() {
            entries.extend(host.rate_limits.iter());
        }
        Some(Routed { route, entries })
    }

    /// Envoy's order: an exact domain, then the longest `*suffix`, then the longest `prefix*`,
    /// then `*`.
    fn virtual_host(&self, host: &str) -> Option<&VirtualHost> {
        let with = |pick: &dyn Fn(&str) -> Option<usize>| {
            self.virtual_hosts
                .iter()
                .filter_map(|vh| {
                    vh.domains
                        .iter()
                        .filter_map(|d| pick(d))
                        .max()
                        .map(|len| (len, vh))
                })
                .max_by_key(|(len, _)| *len)
                .map(|(_, vh)| vh)
        };
        with(&|d| (d == host).then_some(d.len()))
            .or_else(|| {
                with(&|d| {
                    let suffix = d.strip_prefix('*')?;
                    (!suffix.is_empty() && host.ends_with(suffix) && host.len() > suffix.len())
                        .then_some(suffix.len())
                })
            })
            .or_else(|| {
                with(&|d| {
                    let prefix = d.strip_suffix('*')?;
                    (!prefix.is_empty() && host.starts_with(prefix) && host.len() > prefix.len())
                        .then_some(prefix.len())
                })
            })
            .or_else(|| with(&|d| (d == "*").then_some(0)))
    }
}

impl VirtualHost {
    fn parse(node: &Node<'_>) -> Result<VirtualHost, ConfigError> {
        let domains = node
            .list("domains")?
            .iter()
            .map(|d| {
                d.value
                    .as_str()
                    .map(str::to_ascii_lowercase)
                    .ok_or_else(|| d.error("must be a string"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let routes = node
            .list("routes")?
            .iter()
            .map(Route::parse)
            .collect::<Result<Vec<_>, _>>()?;
        let rate_limits = node
            .list("rate_limits")?
            .iter()
            .map(RateLimitEntry::parse)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(VirtualHost {
            domains,
            routes,
            rate_limits,
        })
    }
}

impl Route {
    fn parse(node: &Node<'_>) -> Result<Route, ConfigError> {
        if let Some(per_filter) = node.field("typed_per_filter_config")
            && per_filter
                .value
                .get("envoy.filters.http.ratelimit")
                .is_some()
        {
            return Err(per_filter.error(
                "the simulator does not model a route's own rate limit filter configuration; \
                 put the route's `rate_limits` on the route",
            ));
        }
        let matcher = node.required("match")?;
        matcher.only(
            &[
                "prefix",
                "path",
                "safe_regex",
                "path_separated_prefix",
                "case_sensitive",
                "headers",
                "query_parameters",
            ],
            "a route match",
        )?;
        let mut paths = ["prefix", "path", "safe_regex", "path_separated_prefix"]
            .into_iter()
            .filter_map(|name| Some((name, matcher.field(name)?)));
        let path =
            match (paths.next(), paths.next()) {
                (Some((kind, value)), None) => {
                    let text = || {
                        value
                            .value
                            .as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| value.error("must be a string"))
                    };
                    match kind {
                        "prefix" => PathMatch::Prefix(text()?),
                        "path" => PathMatch::Path(text()?),
                        "path_separated_prefix" => PathMatch::SeparatedPrefix(text()?),
                        _ => PathMatch::Regex(safe_regex(&value, false)?),
                    }
                }
                _ => return Err(matcher.error(
                    "a route match takes one of prefix, path, safe_regex, path_separated_prefix",
                )),
            };
        let action = if let Some(route) = node.field("route") {
            let cluster = route.string("cluster")?.map(str::to_owned);
            Some((route, cluster))
        } else if node.field("direct_response").is_some() || node.field("redirect").is_some() {
            None
        } else {
            return Err(node.error("a route needs `route`, `direct_response` or `redirect`"));
        };
        let (rate_limits, include_vh_rate_limits) = match &action {
            Some((route, _)) => (
                route
                    .list("rate_limits")?
                    .iter()
                    .map(RateLimitEntry::parse)
                    .collect::<Result<Vec<_>, _>>()?,
                route.bool("include_vh_rate_limits")?.unwrap_or(false),
            ),
            None => (Vec::new(), false),
        };
        Ok(Route {
            path,
            case_sensitive: matcher.bool("case_sensitive")?.unwrap_or(true),
            headers: matcher
                .list("headers")?
                .iter()
                .map(HeaderMatcher::parse)
                .collect::<Result<_, _>>()?,
            query_parameters: matcher
                .list("query_parameters")?
                .iter()
                .map(QueryParameterMatcher::parse)
                .collect::<Result<_, _>>()?,
            cluster: action.map(|(_, cluster)| cluster),
            rate_limits,
            include_vh_rate_limits,
            metadata: node.field("metadata").map(|m| m.value.clone()),
        })
    }

    fn matches(&self, request: &Downstream<'_>) -> bool {
        let path = request.path();
        let starts = |prefix: &str| {
            if self.case_sensitive {
                path.starts_with(prefix)
            } else {
                path.len() >= prefix.len()
                    && path.is_char_boundary(prefix.len())
                    && path[..prefix.len()].eq_ignore_ascii_case(prefix)
            }
        };
        let path_matches = match &self.path {
            PathMatch::Prefix(prefix) => starts(prefix),
            PathMatch::Path(exact) => {
                if self.case_sensitive {
                    path == exact
                } else {
                    path.eq_ignore_ascii_case(exact)
                }
            }
            PathMatch::Regex(regex) => regex.is_match(path),
            PathMatch::SeparatedPrefix(prefix) => {
                starts(prefix) && matches!(path.as_bytes().get(prefix.len()), None | Some(b'/'))
            }
        };
        path_matches
            && all_headers_match(&self.headers, request)
            && self.query_parameters.iter().all(|q| q.matches(request))
    }
}
