//! What sluice-server, as Envoy's Rate Limit Quota Service, gives each bucket: the
//! configuration of `--rlqs-config`, validated once, and the lookup of a bucket id in it.
//!
//! Envoy's `rate_limit_quota` filter sorts requests into buckets, each named by a bucket id (a
//! map its `bucket_id_builder` makes, such as `{name: per-key, key: <the request's API key>}`),
//! and reports each bucket's use under its `domain`. Here a domain holds rules tried in order;
//! the first whose `match` a bucket id meets gives its quota, and a bucket no rule matches gets
//! the domain's `default`. Every bucket id is a limit of its own: a rule matching `key: "*"`
//! gives each API key its own limit.
//!
//! ```
//! use sluice_core::rlqs::{BucketId, Quota, RlqsConfig, raw::RawRlqsConfig};
//! let raw: RawRlqsConfig = serde_json::from_str(r#"{
//!     "domain": "shop",
//!     "buckets": [
//!         {"match": {"name": "per-key", "key": "partner-*"}, "allow": "all"},
//!         {"match": {"name": "per-key", "key": "*"},
//!          "limit": {"algorithm": "gcra", "rate": 100, "per": "1s", "burst": 100}}
//!     ],
//!     "default": {"deny": "all"}
//! }"#).unwrap();
//! let config = RlqsConfig::from_raw([raw]).unwrap();
//! let bucket = |key: &str| BucketId::from_iter([("name", "per-key"), ("key", key)]);
//! assert_eq!(config.rule_for("shop", &bucket("partner-7")).unwrap().quota, Quota::AllowAll);
//! assert!(matches!(config.rule_for("shop", &bucket("k1")).unwrap().quota, Quota::Limit(_)));
//! let other = BucketId::from_iter([("name", "catch-all")]);
//! assert_eq!(config.rule_for("shop", &other).unwrap().quota, Quota::DenyAll);
//! assert!(config.rule_for("elsewhere", &other).is_none());
//! ```

pub mod bucket;
mod bucket_id;
pub mod envoy_bucket;
pub mod raw;
pub mod report;

pub use self::bucket_id::BucketId;

use std::collections::BTreeMap;

use crate::duration::Millis;
use crate::file_error::FileError;
use crate::key::{LimitKey, RuleName};
use crate::limit::Limit;
use crate::rls::wildcard_match;

use self::raw::{RawBucketRule, RawRlqsConfig};

/// How long a bucket nobody uses is kept when the configuration does not say.
pub const DEFAULT_IDLE_AFTER_MS: u64 = 5 * 60 * 1000;

const DEFAULT_IDLE_AFTER: Millis = match Millis::new(DEFAULT_IDLE_AFTER_MS) {
    Some(idle) => idle,
    None => panic!("the default idle_after is not zero"),
};

/// What a bucket gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quota {
    /// Every request allowed; no limit is kept (Envoy's `ALLOW_ALL`).
    AllowAll,
    /// Every request denied (Envoy's `DENY_ALL`).
    DenyAll,
    /// A limit, shared among the Envoys that report the bucket.
    Limit(Limit),
}

/// How a bucket's limit is divided among the Envoys that report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Share {
    /// In proportion to what each reported using.
    #[default]
    Demand,
    /// In equal parts.
    Equal,
}

/// The rule that gives a bucket its quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketRule {
    /// Its name, in metrics and in its buckets' Redis keys.
    pub name: RuleName,
    /// The entries a bucket id must hold, each value exact or with `*` wildcards.
    pub matches: BTreeMap<String, String>,
    /// What each bucket it covers gets.
    pub quota: Quota,
    /// How a bucket's limit is shared among Envoys.
    pub share: Share,
}

impl BucketRule {
    /// Whether `bucket` holds every entry the rule asks for.
    pub fn covers(&self, bucket: &BucketId) -> bool {
        self.matches.iter().all(|(key, pattern)| {
            bucket
                .get(key)
                .is_some_and(|value| wildcard_match(pattern, value))
        })
    }
}

/// One domain's rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    /// Tried in order.
    pub rules: Vec<BucketRule>,
    /// What a bucket no rule covers gets; named `default` unless it names itself.
    pub default: BucketRule,
    /// How long a bucket nobody uses is kept before it is abandoned.
    pub idle_after: Millis,
}

/// The whole configuration: each domain's rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RlqsConfig {
    domains: BTreeMap<String, Domain>,
}

impl RlqsConfig {
    /// Validates `files`, one domain each.
    pub fn from_raw(
        files: impl IntoIterator<Item = RawRlqsConfig>,
    ) -> Result<RlqsConfig, FileError> {
        let mut config = RlqsConfig::default();
        for (file, raw) in files.into_iter().enumerate() {
            let error = |(path, reason): (String, String)| FileError { file, path, reason };
            if raw.domain.is_empty() {
                return Err(error(("domain".into(), "a domain is required".into())));
            }
            if config.domains.contains_key(&raw.domain) {
                return Err(error((
                    "domain".into(),
                    format!("`{}` is configured by an earlier file too", raw.domain),
                )));
            }
            let domain = load_domain(&raw).map_err(error)?;
            config.domains.insert(raw.domain.clone(), domain);
        }
        Ok(config)
    }

    /// The domains configured.
    pub fn domains(&self) -> impl Iterator<Item = (&str, &Domain)> {
        self.domains
            .iter()
            .map(|(name, domain)| (name.as_str(), domain))
    }

    /// Each domain and how many of its rules, the default included, can deny: a limit or
    /// `DENY_ALL`.
    pub fn limits_per_domain(&self) -> BTreeMap<String, usize> {
        self.domains
            .iter()
            .map(|(name, domain)| {
                let limits = domain
                    .rules
                    .iter()
                    .chain([&domain.default])
                    .filter(|rule| rule.quota != Quota::AllowAll)
                    .count();
                (name.clone(), limits)
            })
            .collect()
    }

    /// The domain named `name`, if configured.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// How long a bucket of `domain` may go unused before it is abandoned: the domain's
    /// `idle_after`, or the default for a domain no longer configured.
    pub fn idle_after(&self, domain: &str) -> Millis {
        self.domain(domain)
            .map_or(DEFAULT_IDLE_AFTER, |d| d.idle_after)
    }

    /// The rule that gives `bucket` of `domain` its quota; `None` for a domain not configured.
    pub fn rule_for(&self, domain: &str, bucket: &BucketId) -> Option<&BucketRule> {
        self.domain(domain).map(|domain| domain.rule_for(bucket))
    }
}

impl Domain {
    /// The rule that gives `bucket` its quota: the first that covers it, else the default.
    pub fn rule_for(&self, bucket: &BucketId) -> &BucketRule {
        self.rules
            .iter()
            .find(|rule| rule.covers(bucket))
            .unwrap_or(&self.default)
    }
}

/// The key of a bucket's limit: the domain, then each entry's key and value (in the bucket id's
/// order, which is sorted), escaped and joined, so two buckets share a limit only when their
/// ids are the same.
pub fn bucket_key(domain: &str, bucket: &BucketId) -> LimitKey {
    LimitKey::from_parts(
        std::iter::once(domain.as_bytes()).chain(
            bucket
                .entries()
                .flat_map(|(k, v)| [k.as_bytes(), v.as_bytes()]),
        ),
    )
}

type LoadError = (String, String);

fn load_domain(raw: &RawRlqsConfig) -> Result<Domain, LoadError> {
    let mut rules: Vec<BucketRule> = Vec::with_capacity(raw.buckets.len());
    for (i, raw_rule) in raw.buckets.iter().enumerate() {
        let path = format!("buckets[{i}]");
        if raw_rule.matches.is_empty() {
            return Err((
                format!("{path}.match"),
                "a rule needs at least one entry to match (the domain's `default` takes the rest)"
                    .into(),
            ));
        }
        let rule = bucket_rule(raw_rule, &format!("bucket{i}"), &path)?;
        if rules.iter().any(|r| r.name == rule.name) {
            return Err((
                format!("{path}.name"),
                format!("`{}` names an earlier rule too", rule.name),
            ));
        }
        rules.push(rule);
    }
    let default = match &raw.default {
        Some(raw_default) if !raw_default.matches.is_empty() => {
            return Err((
                "default.match".into(),
                "the default takes every bucket no rule matches, so it matches nothing itself"
                    .into(),
            ));
        }
        Some(raw_default) => bucket_rule(raw_default, "default", "default")?,
        None => BucketRule {
            name: rule_name(None, "default", "default")?,
            matches: BTreeMap::new(),
            quota: Quota::AllowAll,
            share: Share::default(),
        },
    };
    if rules.iter().any(|r| r.name == default.name) {
        return Err((
            "default.name".into(),
            format!("`{}` names a rule too", default.name),
        ));
    }
    let idle_after = raw
        .idle_after
        .or(Some(DEFAULT_IDLE_AFTER))
        .filter(|idle| idle.as_millis() >= 1000)
        .ok_or_else(|| {
            (
                "idle_after".to_owned(),
                "must be at least 1s: Envoy reports every few seconds".to_owned(),
            )
        })?;
    Ok(Domain {
        rules,
        default,
        idle_after,
    })
}

/// One rule at `path`, named `fallback_name` unless it names itself.
fn bucket_rule(
    raw: &RawBucketRule,
    fallback_name: &str,
    path: &str,
) -> Result<BucketRule, LoadError> {
    if let Some((key, _)) = raw
        .matches
        .iter()
        .find(|(k, v)| k.is_empty() || v.is_empty())
    {
        return Err((
            format!("{path}.match"),
            format!("`{key}`: keys and values must not be empty (Envoy sends none)"),
        ));
    }
    Ok(BucketRule {
        name: rule_name(raw.name.as_deref(), fallback_name, path)?,
        matches: raw.matches.clone(),
        quota: quota(raw, path)?,
        share: share(raw.share.as_deref(), path)?,
    })
}

fn rule_name(given: Option<&str>, fallback: &str, path: &str) -> Result<RuleName, LoadError> {
    RuleName::new(given.unwrap_or(fallback)).map_err(|e| (format!("{path}.name"), e.to_string()))
}

fn quota(raw: &RawBucketRule, path: &str) -> Result<Quota, LoadError> {
    let all = |field: &str, value: &str| {
        if value == "all" {
            Ok(())
        } else {
            Err((
                format!("{path}.{field}"),
                format!("must be `all`, not `{value}`"),
            ))
        }
    };
    match (&raw.limit, &raw.allow, &raw.deny) {
        (Some(limit), None, None) => Limit::try_from(limit.clone())
            .map_err(|e| e.to_string())
            .and_then(|limit| quota_limit(limit).map(Quota::Limit))
            .map_err(|reason| (format!("{path}.limit"), reason)),
        (None, Some(allow), None) => all("allow", allow).map(|()| Quota::AllowAll),
        (None, None, Some(deny)) => all("deny", deny).map(|()| Quota::DenyAll),
        _ => Err((
            path.to_owned(),
            "give exactly one of `limit`, `allow: all` and `deny: all`".into(),
        )),
    }
}

/// `limit`, if Envoy's token bucket can keep it: Envoy admits or denies (it does not delay),
/// and refills once a second, each second's refill funded at once out of the algorithm, so the
/// limit must admit a second of its rate at once.
fn quota_limit(limit: Limit) -> Result<Limit, String> {
    if limit.shapes() {
        return Err(
            "a shaping leaky bucket delays requests, which Envoy's quota filter cannot: use `mode: meter`".into(),
        );
    }
    let (units, period) = limit.nominal_rate();
    let one_second = (units.saturating_mul(1000)).div_ceil(period.as_millis().max(1));
    if limit.capacity() < one_second {
        return Err(format!(
            "admits {} at once, less than one second of its rate ({one_second}): Envoy refills its token buckets once a second, and sluice funds each second's refill at once; raise `burst` (or `limit`) to {one_second}",
            limit.capacity()
        ));
    }
    Ok(limit)
}

fn share(raw: Option<&str>, path: &str) -> Result<Share, LoadError> {
    match raw {
        None | Some("demand") => Ok(Share::Demand),
        Some("equal") => Ok(Share::Equal),
        Some(other) => Err((
            format!("{path}.share"),
            format!("must be `demand` or `equal`, not `{other}`"),
        )),
    }
}

#[cfg(test)]
mod tests;
