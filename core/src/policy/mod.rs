//! The filter's configuration: parsed from JSON once, validated once, then only read.
//!
//! ```
//! use sluice_core::policy::{HttpRequest, Policy};
//!
//! let policy = Policy::from_json(br#"{
//!     "cluster": "sluice",
//!     "rules": [{
//!         "name": "per-ip",
//!         "match": {"path": {"prefix": "/api/"}},
//!         "key": ["client_ip"],
//!         "limit": {"algorithm": "gcra", "rate": 10, "per": "1s", "burst": 10}
//!     }]
//! }"#).unwrap();
//!
//! let request = HttpRequest {
//!     headers: [(":path".into(), b"/api/items?page=2".as_slice().into()), (":method".into(), b"GET".as_slice().into())]
//!         .into_iter()
//!         .collect(),
//!     source_address: Some("203.0.113.7:51000".into()),
//! };
//! let checks = policy.checks_for(&request);
//! assert_eq!(checks.len(), 1);
//! assert_eq!(checks[0].key.as_str(), "203.0.113.7");
//!
//! let err = Policy::from_json(br#"{"cluster": "sluice", "rules": [{"name": "r", "key": ["client_ip"],
//!     "limit": {"algorithm": "gcra", "rate": 10, "per": "1s"}}]}"#).unwrap_err();
//! assert!(err.to_string().starts_with("rules[0].limit: algorithm `gcra` needs `burst`"));
//! ```

mod error;
mod key_parts;
mod matcher;
pub mod raw;
mod request;
mod validate;

pub use error::PolicyError;
pub(crate) use error::field;
use key_parts::build_key_in;
pub use key_parts::{KeyPart, KeySource, build_key};
pub use matcher::{HeaderMatch, RequestMatch, StringMatch};
pub use request::{ClientIp, Header, Headers, HttpRequest};

use crate::duration::Millis;
use crate::key::RuleName;
use crate::key::{KeyBuilder, LimitKey};
use crate::lease::LeaseConfig;
use crate::limit::Limit;
use crate::wire::{Check, CheckTemplate};

/// The callout timeout when none is configured.
pub const DEFAULT_TIMEOUT: Millis = match Millis::new(100) {
    Some(ms) => ms,
    None => unreachable!(),
};
/// Deny-cache slots when `deny_cache` is `true` or absent.
pub const DEFAULT_DENY_CACHE_SLOTS: u32 = 4096;
/// The most deny-cache slots.
pub const MAX_DENY_CACHE_SLOTS: u32 = 1 << 20;
/// The longest callout timeout accepted.
pub const MAX_TIMEOUT_MS: u64 = 60_000;

/// What the filter does when sluice-server cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// Let the request through (fail open).
    Allow,
    /// Deny it with 503 (fail closed).
    Deny,
}

/// Which rate-limit headers to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderStyle {
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (seconds).
    XRateLimit,
    /// The IETF draft's `RateLimit-Policy` and `RateLimit` fields.
    Ietf,
    /// None (`Retry-After` is still sent on denials).
    None,
}

/// What denied requests get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseConfig {
    /// The status of a denial.
    pub status: u16,
    /// The body of a denial.
    pub body: String,
    /// The header style.
    pub headers: HeaderStyle,
    /// Whether allowed responses carry the headers too.
    pub on_allowed: bool,
}

/// Where sluice-server is and how to call it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// The Envoy cluster.
    pub cluster: String,
    /// The callouts' `:authority`.
    pub authority: String,
    /// How long a callout may take.
    pub timeout: Millis,
    /// The `authorization` header's value (`Bearer <token>`), if the server wants a token.
    pub authorization: Option<String>,
}

/// One validated rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Its unique name.
    pub name: RuleName,
    /// Which requests it applies to.
    pub matcher: RequestMatch,
    /// What its key is built from.
    pub key: Vec<KeyPart>,
    /// The limit.
    pub limit: Limit,
    /// Units per request.
    pub cost: u64,
    /// Decide and count, never deny.
    pub shadow: bool,
    /// Denials consume too.
    pub count_denied: bool,
    /// Lease mode, when on.
    pub lease: Option<LeaseConfig>,
    /// This rule's checks on the wire, all but the key.
    pub template: CheckTemplate,
}

impl Rule {
    /// The check this rule sends for `key`.
    pub fn check(&self, key: LimitKey) -> Check {
        Check {
            rule: self.name.clone(),
            key,
            limit: self.limit,
            cost: self.cost,
            count_denied: self.count_denied,
            shadow: self.shadow,
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Policy {
    /// sluice-server.
    pub service: Service,
    /// What to do when it cannot answer.
    pub failure_mode: FailureMode,
    /// Trusted `x-forwarded-for` hops.
    pub trusted_hops: u32,
    /// Slots of the local deny cache; 0 when it is off.
    pub deny_cache_slots: u32,
    /// Denial and header settings.
    pub response: ResponseConfig,
    /// The rules, in order.
    pub rules: Vec<Rule>,
    /// The request headers the rules read, when the first value of each is all they read;
    /// `None` when they need every header (every `x-forwarded-for` line, with trusted hops).
    pub headers_read: Option<Vec<String>>,
    /// Whether a rule keys on the client's address, so that the connection's peer must be
    /// read (a host call on every request in Envoy).
    pub reads_source_address: bool,
}

/// A check a request needs: the rule it comes from and the request's key for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedCheck {
    /// Index into [`Policy::rules`].
    pub rule: usize,
    /// The request's key for that rule.
    pub key: LimitKey,
}

/// What a request needs: [`Policy::plan`].
#[derive(Debug, Clone)]
pub struct Plan {
    /// The checks, as [`Policy::checks_for`] gives them.
    pub checks: Vec<PlannedCheck>,
    /// A key took the peer's address for an unreadable `x-forwarded-for` entry.
    pub client_ip_fell_back: bool,
}

impl Policy {
    /// The checks `request` needs, one per rule that matches it and can build its key, in rule
    /// order. An empty list means no callout.
    pub fn checks_for(&self, request: &HttpRequest<'_>) -> Vec<PlannedCheck> {
        self.plan(request).checks
    }

    /// [`Policy::checks_for`], and whether a key had to take the peer's address for an
    /// unreadable `x-forwarded-for` entry (see [`ClientIp::fallback`]), which the filter
    /// counts.
    pub fn plan(&self, request: &HttpRequest<'_>) -> Plan {
        let mut checks = Vec::new();
        let client_ip_fell_back = self.plan_into(request, &mut checks);
        Plan {
            checks,
            client_ip_fell_back,
        }
    }

    /// [`Policy::plan`] into `checks`, in place of what it held: each key is built in the
    /// string of the check it replaces, so that a filter planning request after request in
    /// one list allocates nothing once the list has grown. Returns
    /// [`Plan::client_ip_fell_back`].
    pub fn plan_into(&self, request: &HttpRequest<'_>, checks: &mut Vec<PlannedCheck>) -> bool {
        let source = KeySource::new(request, self.trusted_hops);
        let mut planned = 0;
        for (i, rule) in self.rules.iter().enumerate() {
            if !rule.matcher.matches(request) {
                continue;
            }
            let buffer = checks
                .get_mut(planned)
                .map(|check| String::from(std::mem::take(&mut check.key)))
                .unwrap_or_default();
            let Some(key) = build_key_in(&rule.key, &source, KeyBuilder::in_buffer(buffer)) else {
                continue;
            };
            let check = PlannedCheck { rule: i, key };
            match checks.get_mut(planned) {
                Some(slot) => *slot = check,
                None => checks.push(check),
            }
            planned += 1;
        }
        checks.truncate(planned);
        source.client_ip_fell_back()
    }
}

#[cfg(test)]
mod tests;
