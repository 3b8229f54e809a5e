//! Envoy's native rate limit filter (`envoy.filters.http.ratelimit`) as a model: the
//! descriptors Envoy would send for each request of a trace, read from the configuration the
//! user deploys, and the `ShouldRateLimit` calls that decide them (in [`replay`]).
//!
//! - [`config`]: the listener, its connection manager, its rate limit filters, the runtime.
//! - [`route`]: the inline route table: virtual hosts, routes, and their `rate_limits`.
//! - [`action`]: each `rate_limits` entry's actions, making one descriptor.
//! - [`matcher`]: Envoy's string, header and query parameter matchers.
//! - [`request`]: a trace request as the filters see it, with its downstream address.
//! - [`node`]: the walk through the YAML that names where anything refused is.
//! - [`replay`]: the calls, in virtual time; [`session`]: a replay from start to report;
//!   [`compare`]: the YAML as written beside every algorithm, a replay each.
//!
//! What the model cannot know from a trace (dynamic metadata, whether a request was
//! internal, RDS) is refused by name at start, never taken as "not limited".

pub mod action;
pub mod compare;
pub mod config;
pub mod matcher;
pub mod node;
pub mod replay;
pub mod request;
pub mod route;
pub mod session;

use std::net::IpAddr;

use self::action::ActionInputs;
pub use self::config::{NativeConfig, RateLimitFilter};
pub use self::node::ConfigError;
use self::request::Downstream;

/// One descriptor: its (key, value) entries, outermost first.
pub type Descriptor = Vec<(String, String)>;

/// The call one rate limit filter makes for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterCall {
    /// The filter, by its place among [`NativeConfig::filters`].
    pub filter: usize,
    /// The descriptors it sends.
    pub descriptors: Vec<Descriptor>,
}

impl NativeConfig {
    /// A request with `headers` from `peer`, with the client address the connection manager
    /// settles on.
    pub fn downstream<'a>(&self, headers: &'a [(String, String)], peer: IpAddr) -> Downstream<'a> {
        self.addresses.downstream(headers, peer)
    }

    /// The calls Envoy's rate limit filters make for `request`, in chain order: a filter whose
    /// stage has no descriptor for the request makes none, and a request with no route makes
    /// none at all.
    pub fn calls(&self, request: &Downstream<'_>) -> Vec<FilterCall> {
        let Some(routed) = self.routes.route(request) else {
            return Vec::new();
        };
        let inputs = ActionInputs {
            request,
            route_cluster: routed.route.cluster.as_ref().and_then(|c| c.as_deref()),
            route_metadata: routed.route.metadata.as_ref(),
            local_cluster: &self.local_cluster,
        };
        self.filters
            .iter()
            .enumerate()
            .filter_map(|(index, filter)| {
                let descriptors: Vec<Descriptor> = routed
                    .entries
                    .iter()
                    .filter(|e| e.stage == filter.stage)
                    .filter(|e| {
                        e.disable_key
                            .as_deref()
                            .is_none_or(|k| self.entry_enabled(k))
                    })
                    .filter_map(|e| e.descriptor(&inputs))
                    .collect();
                (!descriptors.is_empty()).then_some(FilterCall {
                    filter: index,
                    descriptors,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
