//! Envoy's rate limit service configuration, in the format of the reference service
//! (envoyproxy/ratelimit): a domain, a tree of descriptors, and a limit where a request's
//! descriptor ends.
//!
//! A request carries descriptors, each a list of (key, value) entries. One descriptor is looked
//! up by walking the tree an entry at a level: at each level the entry's `key_value` is tried
//! first, then a value with `*` wildcards (each any run of characters), then the bare `key` (any
//! value). The limit found at the level of the descriptor's last entry applies; a descriptor
//! longer or shorter than the tree has none. Every distinct descriptor (all its keys and values) is counted apart, so a bare `key`
//! limits each value on its own.
//!
//! ```
//! use sluice_core::rls::{RlsConfig, raw::RawRlsConfig};
//! let raw: RawRlsConfig = serde_json::from_str(r#"{
//!     "domain": "shop",
//!     "descriptors": [{"key": "remote_address",
//!                      "rate_limit": {"unit": "second", "requests_per_unit": 10}}]
//! }"#).unwrap();
//! let config = RlsConfig::from_raw([raw]).unwrap();
//! let found = config.lookup("shop", &[("remote_address", "203.0.113.9")]).unwrap();
//! assert_eq!(found.rule.requests_per_unit, 10);
//! assert_eq!(found.counter, "remote_address_203.0.113.9");
//! assert!(config.lookup("shop", &[("path", "/")]).is_none());
//! ```

pub mod answer;
pub mod merged;
pub mod raw;
pub mod request;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::duration::Millis;
use crate::file_error::FileError;
use crate::key::RuleName;
use crate::limit::{Limit, RawLimit};

use self::raw::{RawDescriptor, RawRateLimit, RawRlsConfig};

/// The reference's units, and how long each lasts (a month is 30 days, as the reference counts
/// it). Years are refused: sluice keeps no window longer than 30 days.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3600 s.
    Hour,
    /// 86400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
}

impl Unit {
    fn parse(name: &str) -> Option<Unit> {
        Some(match name.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            _ => return None,
        })
    }

    /// Its name in configuration.
    pub const fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
        }
    }

    /// The unit's length.
    pub const fn millis(self) -> u64 {
        match self {
            Unit::Second => 1_000,
            Unit::Minute => 60_000,
            Unit::Hour => 3_600_000,
            Unit::Day => 86_400_000,
            Unit::Week => 7 * 86_400_000,
            Unit::Month => 30 * 86_400_000,
        }
    }

    /// The unit's length, as a limit's window.
    pub const fn window(self) -> Millis {
        match Millis::new(self.millis()) {
            Some(window) => window,
            None => Millis::MIN,
        }
    }

    /// The value of `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit`.
    pub const fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Week => 7,
        }
    }

    /// The unit a request's own limit override names (`RateLimitDescriptor.limit.unit`).
    pub fn from_proto(value: i32) -> Option<Unit> {
        Some(match value {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            7 => Unit::Week,
            _ => return None,
        })
    }
}

/// What a descriptor that ends at a limit is held to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsRule {
    /// The path in the tree, `domain.key_value.key`: the rule's name in stats and in Redis.
    pub full_key: String,
    /// [`Self::full_key`] as the name of the checks it makes ([`RuleName::lossy`]), made once
    /// here rather than on every request.
    pub rule_name: RuleName,
    /// The unit and requests per unit answers report.
    pub unit: Unit,
    /// See [`Self::unit`].
    pub requests_per_unit: u64,
    /// How the rule decides; `None` when unlimited.
    pub limit: Option<Limit>,
    /// Decide and count, but never deny.
    pub shadow_mode: bool,
    /// Its name, for other rules' `replaces`.
    pub name: Option<String>,
    /// The names of rules this one replaces.
    pub replaces: Vec<String>,
    /// Stats per value when the matched level had no value.
    pub detailed_metric: bool,
}

/// A descriptor's rule, and the counter that descriptor keeps.
#[derive(Debug, Clone)]
pub struct Found {
    /// The rule.
    pub rule: Arc<RlsRule>,
    /// Every `key_value` (or `key`, for an empty value) of the descriptor, joined by `.`:
    /// requests with the same descriptor share it.
    pub counter: String,
    /// The stats name: the rule's `full_key`, with the value appended where `detailed_metric`
    /// asks for it.
    pub stats_key: String,
}

#[derive(Debug, Default)]
struct Level {
    /// By `key` or `key_value`.
    nodes: BTreeMap<String, Node>,
    /// The entries whose value holds a `*`, in the order written.
    wildcards: Vec<String>,
}

#[derive(Debug, Default)]
struct Node {
    rule: Option<Arc<RlsRule>>,
    children: Level,
}

/// Every domain's descriptor tree, validated.
#[derive(Debug, Default)]
pub struct RlsConfig {
    domains: BTreeMap<String, Level>,
}

impl RlsConfig {
    /// Validates files of the reference's format. Two files may not name the same domain.
    pub fn from_raw(files: impl IntoIterator<Item = RawRlsConfig>) -> Result<RlsConfig, FileError> {
        let mut config = RlsConfig::default();
        for (file, raw) in files.into_iter().enumerate() {
            let error = |path: &str, reason: String| FileError {
                file,
                path: path.to_owned(),
                reason,
            };
            if raw.domain.is_empty() {
                return Err(error("domain", "a configuration needs a domain".into()));
            }
            if config.domains.contains_key(&raw.domain) {
                return Err(error(
                    "domain",
                    format!("domain `{}` is configured in another file too", raw.domain),
                ));
            }
            let level = load_level(&raw.descriptors, &raw.domain, "descriptors")
                .map_err(|(path, reason)| error(&path, reason))?;
            config.domains.insert(raw.domain, level);
        }
        Ok(config)
    }

    /// The domains configured.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// Each domain and how many of its descriptors hold a limit (not `unlimited`).
    pub fn limits_per_domain(&self) -> BTreeMap<String, usize> {
        fn limits(level: &Level) -> usize {
            level
                .nodes
                .values()
                .map(|node| {
                    let own = node.rule.as_ref().is_some_and(|r| r.limit.is_some());
                    usize::from(own) + limits(&node.children)
                })
                .sum()
        }
        self.domains
            .iter()
            .map(|(name, level)| (name.clone(), limits(level)))
            .collect()
    }

    /// Every rule, domain by domain, each level's in key order before its children's.
    pub fn rules(&self) -> Vec<Arc<RlsRule>> {
        fn walk(level: &Level, out: &mut Vec<Arc<RlsRule>>) {
            out.extend(level.nodes.values().filter_map(|n| n.rule.clone()));
            for node in level.nodes.values() {
                walk(&node.children, out);
            }
        }
        let mut out = Vec::new();
        for level in self.domains.values() {
            walk(level, &mut out);
        }
        out
    }

    /// The rule a descriptor ends at in `domain`, if any (the reference's `GetLimit`).
    pub fn lookup(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Found> {
        let (rule, stats_key) = self.rule_of(domain, entries)?;
        Some(Found {
            rule,
            counter: counter_of(entries.iter().copied()),
            stats_key,
        })
    }

    /// [`Self::lookup`] without the counter: the rule and its stats name.
    pub(crate) fn rule_of<K: AsRef<str>, V: AsRef<str>>(
        &self,
        domain: &str,
        entries: &[(K, V)],
    ) -> Option<(Arc<RlsRule>, String)> {
        let mut level = self.domains.get(domain)?;
        let mut found: Option<&Arc<RlsRule>> = None;
        let mut valueless_match = false;
        let mut key_value = String::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            let key = key.as_ref();
            key_value.clear();
            key_value.push_str(key);
            key_value.push('_');
            key_value.push_str(value.as_ref());
            let (node, by_value) = match level.nodes.get(&key_value) {
                Some(node) => (Some(node), true),
                None => match level
                    .wildcards
                    .iter()
                    .find(|w| wildcard_match(w, &key_value))
                {
                    Some(wildcard) => (level.nodes.get(wildcard), true),
                    None => (level.nodes.get(key), false),
                },
            };
            let Some(node) = node else { break };
            if i + 1 == entries.len() {
                found = node.rule.as_ref();
                valueless_match = !by_value;
            }
            level = &node.children;
        }
        let rule = Arc::clone(found?);
        let stats_key = match entries.last() {
            Some((_, value)) if rule.detailed_metric && valueless_match => {
                format!("{}_{}", rule.full_key, value.as_ref())
            }
            _ => rule.full_key.clone(),
        };
        Some((rule, stats_key))
    }
}

/// Whether `text` matches `pattern`, where each `*` stands for any run of characters (none
/// included).
pub(crate) fn wildcard_match(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let mut parts: Vec<&str> = parts.collect();
    // With no `*`, the pattern must be the whole text.
    let Some(last) = parts.pop() else {
        return rest.is_empty();
    };
    for part in parts {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Every `key_value` (or `key`, for an empty value) of a descriptor, joined by `.`: what the
/// reference names a descriptor by.
fn counter_of<'a>(entries: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut counter = String::new();
    for (i, (key, value)) in entries.enumerate() {
        if i > 0 {
            counter.push('.');
        }
        counter.push_str(key);
        if !value.is_empty() {
            counter.push('_');
            counter.push_str(value);
        }
    }
    counter
}

type LoadError = (String, String);

fn load_level(descriptors: &[RawDescriptor], parent: &str, path: &str) -> Result<Level, LoadError> {
    let mut level = Level::default();
    for (i, raw) in descriptors.iter().enumerate() {
        let here = format!("{path}[{i}]");
        if raw.key.is_empty() {
            return Err((format!("{here}.key"), "a descriptor needs a key".into()));
        }
        let name = if raw.value.is_empty() {
            raw.key.clone()
        } else {
            format!("{}_{}", raw.key, raw.value)
        };
        let full_key = format!("{parent}.{name}");
        if level.nodes.contains_key(&name) {
            return Err((here, format!("`{full_key}` is configured twice")));
        }
        let rule = match &raw.rate_limit {
            Some(rate_limit) => Some(Arc::new(load_rule(
                rate_limit,
                raw,
                &full_key,
                &format!("{here}.rate_limit"),
            )?)),
            None => None,
        };
        let children = load_level(&raw.descriptors, &full_key, &format!("{here}.descriptors"))?;
        if raw.value.contains('*') {
            level.wildcards.push(name.clone());
        }
        level.nodes.insert(name, Node { rule, children });
    }
    Ok(level)
}

fn load_rule(
    raw: &RawRateLimit,
    descriptor: &RawDescriptor,
    full_key: &str,
    path: &str,
) -> Result<RlsRule, LoadError> {
    let err = |field: &str, reason: String| (format!("{path}.{field}"), reason);
    let unit = match raw.unit.as_deref() {
        Some(name) => Some(Unit::parse(name).ok_or_else(|| {
            err(
                "unit",
                format!("unknown unit `{name}` (second, minute, hour, day, week or month)"),
            )
        })?),
        None => None,
    };
    let replaces = raw
        .replaces
        .iter()
        .enumerate()
        .map(|(i, r)| {
            if r.name.is_empty() {
                Err(err(&format!("replaces[{i}].name"), "an empty name".into()))
            } else if raw.name.as_deref() == Some(r.name.as_str()) {
                Err(err(
                    &format!("replaces[{i}].name"),
                    "a limit cannot replace itself".into(),
                ))
            } else {
                Ok(r.name.clone())
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let rule_name = RuleName::lossy(full_key);
    let rule = |unit, requests_per_unit, limit| RlsRule {
        full_key: full_key.to_owned(),
        rule_name: rule_name.clone(),
        unit,
        requests_per_unit,
        limit,
        shadow_mode: descriptor.shadow_mode,
        name: raw.name.clone(),
        replaces: replaces.clone(),
        detailed_metric: descriptor.detailed_metric,
    };
    if raw.unlimited {
        if unit.is_some() || raw.requests_per_unit != 0 || raw.sluice.is_some() {
            return Err((
                path.to_owned(),
                "an unlimited limit takes no unit, requests_per_unit or sluice".into(),
            ));
        }
        return Ok(rule(Unit::Second, 0, None));
    }
    let unit = unit.ok_or_else(|| err("unit", "a limit needs a unit".into()))?;
    if u32::try_from(raw.requests_per_unit).is_err() {
        return Err(err(
            "requests_per_unit",
            format!("at most {} (answers carry it as a uint32)", u32::MAX),
        ));
    }
    let limit = match &raw.sluice {
        Some(sluice) => {
            let limit =
                Limit::try_from(sluice.clone()).map_err(|e| err("sluice", e.to_string()))?;
            let (units, period) = limit.nominal_rate();
            let same_rate = u128::from(units) * u128::from(unit.millis())
                == u128::from(raw.requests_per_unit) * u128::from(period.as_millis());
            if !same_rate {
                return Err(err(
                    "sluice",
                    format!(
                        "its steady rate, {units} per {period}, is not requests_per_unit ({}) per {}, which answers report",
                        raw.requests_per_unit,
                        unit.name()
                    ),
                ));
            }
            limit
        }
        // The reference blocks a descriptor outright with a limit of 0.
        None if raw.requests_per_unit == 0 => Limit::deny_all(unit.window()),
        None => Limit::try_from(RawLimit {
            algorithm: "fixed_window".into(),
            limit: Some(raw.requests_per_unit),
            window: Some(unit.window()),
            ..RawLimit::default()
        })
        .map_err(|e| err("requests_per_unit", e.to_string()))?,
    };
    Ok(rule(unit, raw.requests_per_unit, Some(limit)))
}
