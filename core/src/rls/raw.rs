//! The reference service's configuration exactly as written (envoyproxy/ratelimit's YAML),
//! before validation. The server reads YAML into these; [`super::RlsConfig::from_raw`]
//! validates them once.

use serde::Deserialize;

use crate::limit::RawLimit;

/// One configuration file: a domain and its descriptors.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRlsConfig {
    /// The domain Envoy names in each request.
    #[serde(default)]
    pub domain: String,
    /// The top level of the descriptor tree.
    #[serde(default)]
    pub descriptors: Vec<RawDescriptor>,
}

/// One level of the tree: an entry's key and, optionally, its value.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDescriptor {
    /// The entry's key.
    #[serde(default)]
    pub key: String,
    /// The entry's value; absent matches any value, and each value is counted apart. A value
    /// ending in `*` matches by prefix.
    #[serde(default)]
    pub value: String,
    /// The limit of a request whose descriptor ends here.
    #[serde(default)]
    pub rate_limit: Option<RawRateLimit>,
    /// Deeper levels.
    #[serde(default)]
    pub descriptors: Vec<RawDescriptor>,
    /// Decide and count, but never deny.
    #[serde(default)]
    pub shadow_mode: bool,
    /// Stats per value for a descriptor without one.
    #[serde(default)]
    pub detailed_metric: bool,
}

/// A descriptor's limit.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimit {
    /// second, minute, hour, day, week or month (any case).
    #[serde(default)]
    pub unit: Option<String>,
    /// Requests per unit.
    #[serde(default)]
    pub requests_per_unit: u64,
    /// Never limit.
    #[serde(default)]
    pub unlimited: bool,
    /// A name other limits' `replaces` can point to.
    #[serde(default)]
    pub name: Option<String>,
    /// Limits this one replaces when both apply to one request.
    #[serde(default)]
    pub replaces: Vec<RawReplaces>,
    /// sluice's extension: the algorithm and its parameters, in place of the reference's fixed
    /// window. Its steady rate must be `requests_per_unit` per `unit`, which answers report.
    #[serde(default)]
    pub sluice: Option<RawLimit>,
}

/// One entry of `replaces`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReplaces {
    /// The replaced limit's `name`.
    #[serde(default)]
    pub name: String,
}
