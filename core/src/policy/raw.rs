//! The configuration exactly as written in Envoy's plugin `configuration`, before validation.
//!
//! Every struct refuses unknown fields, so a misspelt option fails configuration instead of
//! being ignored.

use serde::{Deserialize, Serialize};

use crate::duration::Millis;
use crate::limit::Limit;

/// The whole configuration.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    /// The Envoy cluster that reaches sluice-server.
    pub cluster: String,
    /// The `:authority` of callouts; defaults to the cluster's name.
    #[serde(default)]
    pub authority: Option<String>,
    /// How long a callout may take before the failure mode applies (default 100ms).
    #[serde(default)]
    pub timeout: Option<Millis>,
    /// `allow` (default) or `deny` when sluice-server cannot answer.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(extend("enum" = ["allow", "deny", null])))]
    pub failure_mode: Option<String>,
    /// A bearer token sent to sluice-server.
    #[serde(default)]
    pub token: Option<String>,
    /// Proxies in front of Envoy whose `x-forwarded-for` entries are trusted (default 0: the
    /// client is the peer address).
    #[serde(default)]
    pub trusted_hops: Option<u32>,
    /// Whether denials are remembered locally until they expire: `true` (default, 4096
    /// slots), `false`, or `{"slots": N}`.
    #[serde(default)]
    pub deny_cache: Option<RawDenyCache>,
    /// What a denied request gets, and which headers go on responses.
    #[serde(default)]
    pub response: Option<RawResponse>,
    /// The rules, decided in order.
    pub rules: Vec<RawRule>,
}

/// The deny cache: on, off, or on with a number of slots.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged, expecting = "true, false, or {\"slots\": N}")]
pub enum RawDenyCache {
    /// On with the default size, or off.
    Enabled(bool),
    /// On with this many slots.
    Sized(RawDenyCacheSize),
}

/// The deny cache's size.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RawDenyCacheSize {
    /// How many keys the cache can hold at once (1 to 1048576).
    pub slots: u32,
}

/// The response settings.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RawResponse {
    /// Status of a denial (default 429).
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(range(min = 400, max = 599)))]
    pub status: Option<u16>,
    /// Body of a denial.
    #[serde(default)]
    pub body: Option<String>,
    /// `x-ratelimit` (default), `ietf` or `none`.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(extend("enum" = ["x-ratelimit", "ietf", "none", null])))]
    pub headers: Option<String>,
    /// Whether allowed responses carry the rate-limit headers too (default false).
    #[serde(default)]
    pub on_allowed: Option<bool>,
}

/// One rule.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    /// A unique name: 1 to 64 of `A-Z a-z 0-9 _ . -`.
    #[cfg_attr(
        feature = "schema",
        schemars(regex(pattern = r"^[A-Za-z0-9_.-]{1,64}$"))
    )]
    pub name: String,
    /// Which requests the rule applies to; absent matches every request.
    #[serde(default, rename = "match")]
    pub matcher: Option<RawMatch>,
    /// The parts the key is built from, in order.
    pub key: Vec<RawKeyPart>,
    /// The limit.
    pub limit: Limit,
    /// Units each request consumes (default 1).
    #[serde(default)]
    pub cost: Option<u64>,
    /// Decide and count, never deny (default false).
    #[serde(default)]
    pub shadow: Option<bool>,
    /// Denied requests consume too (default false).
    #[serde(default)]
    pub count_denied: Option<bool>,
    /// Lease mode: Envoy decides most of this rule's requests itself, from units leased ahead
    /// of need (see docs/algorithms.md for the bound it keeps).
    #[serde(default)]
    pub lease: Option<RawLease>,
}

/// A rule's lease settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RawLease {
    /// How far ahead of need an Envoy asks for units: it asks when its allowance for a key
    /// holds less than one horizon of that key's local traffic, for two horizons' worth (at
    /// most 1m).
    pub horizon: Millis,
    /// The most units one Envoy may hold for one key, as a share of the limit's capacity
    /// (`limit` or `burst`); default 0.1.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0, max = 1.0)))]
    pub max_share: Option<f64>,
    /// The most units all Envoys together may hold for one key, as a share of the capacity;
    /// default 0.5. Admissions in any interval stay within the algorithm's bound plus this.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(range(min = 0.0, max = 1.0)))]
    pub max_total_share: Option<f64>,
    /// How long a lease lasts after the Envoy's last call for it; default five horizons, at
    /// least 1s; at least two horizons, at most 1m.
    #[serde(default)]
    pub ttl: Option<Millis>,
}

/// Conditions that must all hold.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RawMatch {
    /// The path, without its query string.
    #[serde(default)]
    pub path: Option<RawStringMatch>,
    /// One method or a list of methods.
    #[serde(default)]
    pub method: Option<OneOrMany>,
    /// The host, lower-cased and without its port.
    #[serde(default)]
    pub host: Option<RawStringMatch>,
    /// Header conditions.
    #[serde(default)]
    pub headers: Vec<RawHeaderMatch>,
}

/// A string or a list of strings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged, expecting = "a method name or a list of method names")]
pub enum OneOrMany {
    /// One.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// Exactly one of the four ways to match a value.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RawStringMatch {
    /// The whole value.
    #[serde(default)]
    pub exact: Option<String>,
    /// A prefix of the value.
    #[serde(default)]
    pub prefix: Option<String>,
    /// A suffix of the value.
    #[serde(default)]
    pub suffix: Option<String>,
    /// A regular expression matching the whole value (as Envoy's `safe_regex`).
    #[serde(default)]
    pub regex: Option<String>,
}

/// A header condition: `present`, or one of the value matches.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RawHeaderMatch {
    /// The header's name (matched case-insensitively).
    pub name: String,
    /// `true`: the header must be there; `false`: it must not.
    #[serde(default)]
    pub present: Option<bool>,
    /// The whole value.
    #[serde(default)]
    pub exact: Option<String>,
    /// A prefix of the value.
    #[serde(default)]
    pub prefix: Option<String>,
    /// A suffix of the value.
    #[serde(default)]
    pub suffix: Option<String>,
    /// A regular expression matching the whole value.
    #[serde(default)]
    pub regex: Option<String>,
}

/// One part of a key: a bare name, or an object naming its source.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(
    untagged,
    expecting = "a key part: \"client_ip\", \"path\", \"method\", \"host\", or an object with one of header, query, const"
)]
pub enum RawKeyPart {
    /// `client_ip`, `path`, `method` or `host`.
    Name(String),
    /// `{"header": ..}`, `{"query": ..}` or `{"const": ..}`, with an optional `default`.
    Source(RawKeySource),
}

/// A key part read from the request by name.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RawKeySource {
    /// A request header's value.
    #[serde(default)]
    pub header: Option<String>,
    /// A query parameter's value.
    #[serde(default)]
    pub query: Option<String>,
    /// A constant.
    #[serde(default, rename = "const")]
    pub constant: Option<String>,
    /// The value to use when the header or parameter is absent; without it the rule does not
    /// apply to such a request.
    #[serde(default)]
    pub default: Option<String>,
}
