//! The configuration validated: [`Policy::from_json`] and [`Policy::from_raw`] turn what the
//! user wrote ([`super::raw`]) into types that cannot hold a bad value, each error naming the
//! field and the reason.

use std::collections::HashSet;

use crate::duration::Millis;
use crate::key::RuleName;
use crate::lease::{LeaseConfig, LeaseTerms, MAX_LEASE_TTL_MS};
use crate::limit::{Limit, MAX_AMOUNT};
use crate::wire::{CheckTemplate, MAX_CHECKS, lease_refusal};

use super::raw::{RawDenyCache, RawLease, RawPolicy, RawResponse, RawRule};
use super::{
    DEFAULT_DENY_CACHE_SLOTS, DEFAULT_TIMEOUT, FailureMode, HeaderStyle, KeyPart,
    MAX_DENY_CACHE_SLOTS, MAX_TIMEOUT_MS, Policy, PolicyError, RequestMatch, ResponseConfig, Rule,
    Service, field,
};

impl Policy {
    /// Parses and validates the configuration; the error names the field and the reason.
    pub fn from_json(json: &[u8]) -> Result<Policy, PolicyError> {
        let mut de = serde_json::Deserializer::from_slice(json);
        let raw: RawPolicy = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let path = if path == "." || path == "?" {
                String::new()
            } else {
                path
            };
            PolicyError::new(&path, e.into_inner().to_string())
        })?;
        de.end().map_err(|e| PolicyError::new("", e.to_string()))?;
        Policy::from_raw(&raw)
    }

    /// Validates a parsed configuration.
    pub fn from_raw(raw: &RawPolicy) -> Result<Policy, PolicyError> {
        if raw.cluster.is_empty() {
            return Err(PolicyError::new(
                "cluster",
                "must name the Envoy cluster of sluice-server",
            ));
        }
        let timeout = raw.timeout.unwrap_or(DEFAULT_TIMEOUT);
        if timeout.as_millis() > MAX_TIMEOUT_MS {
            return Err(PolicyError::new(
                "timeout",
                format!("must be at most 60s, not {timeout}"),
            ));
        }
        if let Some(token) = &raw.token
            && (token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(PolicyError::new(
                "token",
                "must be printable ASCII without spaces",
            ));
        }
        let failure_mode = match raw.failure_mode.as_deref() {
            None | Some("allow") => FailureMode::Allow,
            Some("deny") => FailureMode::Deny,
            Some(other) => {
                return Err(PolicyError::new(
                    "failure_mode",
                    format!("must be `allow` or `deny`, not `{other}`"),
                ));
            }
        };
        if raw.rules.len() > MAX_CHECKS {
            return Err(PolicyError::new(
                "rules",
                format!(
                    "at most {MAX_CHECKS} rules (one request may match them all), not {}",
                    raw.rules.len()
                ),
            ));
        }
        let mut names = HashSet::new();
        let rules = raw
            .rules
            .iter()
            .enumerate()
            .map(|(i, rule)| {
                let path = format!("rules[{i}]");
                let rule = Rule::from_raw(&path, rule)?;
                if !names.insert(rule.name.clone()) {
                    return Err(PolicyError::new(
                        &field(&path, "name"),
                        format!("`{}` is the name of an earlier rule", rule.name),
                    ));
                }
                Ok(rule)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let trusted_hops = raw.trusted_hops.unwrap_or(0);
        let headers_read = headers_read(&rules, trusted_hops);
        let reads_source_address = rules
            .iter()
            .any(|r| r.key.iter().any(|part| matches!(part, KeyPart::ClientIp)));
        Ok(Policy {
            service: Service {
                cluster: raw.cluster.clone(),
                authority: raw.authority.clone().unwrap_or_else(|| raw.cluster.clone()),
                timeout,
                authorization: raw.token.as_ref().map(|t| format!("Bearer {t}")),
            },
            failure_mode,
            trusted_hops,
            deny_cache_slots: deny_cache_slots(raw.deny_cache.as_ref())?,
            response: ResponseConfig::from_raw(raw.response.as_ref())?,
            rules,
            headers_read,
            reads_source_address,
        })
    }
}

/// The headers `rules` read (see [`Policy::headers_read`]).
fn headers_read(rules: &[Rule], trusted_hops: u32) -> Option<Vec<String>> {
    let mut names = Vec::new();
    for rule in rules {
        for part in &rule.key {
            match part {
                KeyPart::ClientIp if trusted_hops > 0 => return None,
                KeyPart::ClientIp | KeyPart::Const(_) => {}
                KeyPart::Path | KeyPart::Query { .. } => names.push(":path"),
                KeyPart::Method => names.push(":method"),
                KeyPart::Host => names.extend([":authority", "host"]),
                KeyPart::Header { name, .. } => names.push(name),
            }
        }
        names.extend(rule.matcher.headers_read());
    }
    let mut names: Vec<String> = names.into_iter().map(str::to_owned).collect();
    names.sort();
    names.dedup();
    Some(names)
}

fn deny_cache_slots(raw: Option<&RawDenyCache>) -> Result<u32, PolicyError> {
    match raw {
        None | Some(RawDenyCache::Enabled(true)) => Ok(DEFAULT_DENY_CACHE_SLOTS),
        Some(RawDenyCache::Enabled(false)) => Ok(0),
        Some(RawDenyCache::Sized(size)) if (1..=MAX_DENY_CACHE_SLOTS).contains(&size.slots) => {
            Ok(size.slots)
        }
        Some(RawDenyCache::Sized(size)) => Err(PolicyError::new(
            "deny_cache.slots",
            format!(
                "must be between 1 and {MAX_DENY_CACHE_SLOTS}, not {}",
                size.slots
            ),
        )),
    }
}

impl Rule {
    fn from_raw(path: &str, raw: &RawRule) -> Result<Rule, PolicyError> {
        let name = RuleName::new(raw.name.clone())
            .map_err(|e| PolicyError::new(&field(path, "name"), e.to_string()))?;
        if raw.key.is_empty() {
            return Err(PolicyError::new(
                &field(path, "key"),
                "needs at least one part; use [{\"const\": \"all\"}] for one key shared by every request",
            ));
        }
        let key = raw
            .key
            .iter()
            .enumerate()
            .map(|(i, part)| KeyPart::from_raw(&format!("{path}.key[{i}]"), part))
            .collect::<Result<Vec<_>, _>>()?;
        let cost = raw.cost.unwrap_or(1);
        if cost > MAX_AMOUNT {
            return Err(PolicyError::new(
                &field(path, "cost"),
                format!("must be at most {MAX_AMOUNT}, not {cost}"),
            ));
        }
        let count_denied = raw.count_denied.unwrap_or(false);
        let lease = match &raw.lease {
            None => None,
            Some(lease) => {
                let path = field(path, "lease");
                if count_denied {
                    return Err(PolicyError::new(
                        &path,
                        "cannot go with `count_denied`: denials decided in Envoy are not counted in Redis",
                    ));
                }
                Some(lease_config(&path, lease, &raw.limit, cost)?)
            }
        };
        let shadow = raw.shadow.unwrap_or(false);
        Ok(Rule {
            template: CheckTemplate::new(&name, &raw.limit, cost, count_denied, shadow),
            name,
            matcher: match &raw.matcher {
                Some(m) => RequestMatch::from_raw(&field(path, "match"), m)?,
                None => RequestMatch::default(),
            },
            key,
            limit: raw.limit,
            cost,
            shadow,
            count_denied,
            lease,
        })
    }
}

/// The longest lease horizon.
const MAX_HORIZON_MS: u64 = 60_000;

fn share(path: &str, name: &str, value: Option<f64>, default: f64) -> Result<f64, PolicyError> {
    let value = value.unwrap_or(default);
    if value > 0.0 && value <= 1.0 {
        Ok(value)
    } else {
        Err(PolicyError::new(
            &field(path, name),
            format!("must be a share of the capacity, above 0 and at most 1, not {value}"),
        ))
    }
}

fn lease_config(
    path: &str,
    raw: &RawLease,
    limit: &Limit,
    cost: u64,
) -> Result<LeaseConfig, PolicyError> {
    let horizon = raw.horizon;
    if horizon.as_millis() > MAX_HORIZON_MS {
        return Err(PolicyError::new(
            &field(path, "horizon"),
            format!("must be at most 1m, not {horizon}"),
        ));
    }
    let max_share = share(path, "max_share", raw.max_share, 0.1)?;
    let total_share = share(path, "max_total_share", raw.max_total_share, 0.5)?;
    if total_share < max_share {
        return Err(PolicyError::new(
            &field(path, "max_total_share"),
            format!("must be at least `max_share` ({max_share}), not {total_share}"),
        ));
    }
    let default_ttl = (5 * horizon.as_millis()).clamp(1_000, MAX_LEASE_TTL_MS);
    let ttl = raw
        .ttl
        .unwrap_or(Millis::new(default_ttl).unwrap_or(Millis::MIN));
    if ttl.as_millis() < 2 * horizon.as_millis() || ttl.as_millis() > MAX_LEASE_TTL_MS {
        return Err(PolicyError::new(
            &field(path, "ttl"),
            format!(
                "must be between two horizons ({}ms) and 1m, not {ttl}",
                2 * horizon.as_millis()
            ),
        ));
    }
    let capacity = limit.capacity();
    let units = |share: f64| ((capacity as f64 * share).floor() as u64).max(1);
    let max_units = units(max_share);
    let terms = LeaseTerms {
        max_units,
        max_outstanding: units(total_share).max(max_units),
        ttl,
    };
    if let Some(reason) = lease_refusal(limit, &terms) {
        return Err(PolicyError::new(path, reason));
    }
    if max_units < 2 * cost {
        return Err(PolicyError::new(
            &field(path, "max_share"),
            format!(
                "lets one Envoy hold {max_units} units of {capacity}, not two requests' worth ({}): such a lease saves no callout; raise it to at least {}",
                2 * cost,
                ((2 * cost) as f64 / capacity as f64 * 100.0).ceil() / 100.0
            ),
        ));
    }
    Ok(LeaseConfig { horizon, terms })
}

impl ResponseConfig {
    fn from_raw(raw: Option<&RawResponse>) -> Result<ResponseConfig, PolicyError> {
        let default = RawResponse::default();
        let raw = raw.unwrap_or(&default);
        let status = raw.status.unwrap_or(429);
        if !(400..=599).contains(&status) {
            return Err(PolicyError::new(
                "response.status",
                format!("must be an error status (400 to 599), not {status}"),
            ));
        }
        let headers = match raw.headers.as_deref() {
            None | Some("x-ratelimit") => HeaderStyle::XRateLimit,
            Some("ietf") => HeaderStyle::Ietf,
            Some("none") => HeaderStyle::None,
            Some(other) => {
                return Err(PolicyError::new(
                    "response.headers",
                    format!("must be `x-ratelimit`, `ietf` or `none`, not `{other}`"),
                ));
            }
        };
        Ok(ResponseConfig {
            status,
            body: raw
                .body
                .clone()
                .unwrap_or_else(|| "rate limited\n".to_owned()),
            headers,
            on_allowed: raw.on_allowed.unwrap_or(false),
        })
    }
}
