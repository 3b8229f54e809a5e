//! One `ShouldRateLimit` call, before Redis: which rule applies to each of the request's
//! descriptors, and the checks sluice decides for them, all or nothing.
//!
//! As the reference service (envoyproxy/ratelimit `src/service/ratelimit.go`) does:
//! - each descriptor is looked up on its own ([`RlsConfig::lookup`]); one that carries its own
//!   limit (`RateLimitDescriptor.limit`) is held to that, as a fixed window, in a known domain;
//! - a matched limit whose `name` another matched limit `replaces` does not apply;
//! - an `unlimited` limit applies no limit;
//! - a descriptor's `hits_addend` is its cost when set (0 only asks), else the request's, else 1.
//!
//! Unlike the reference, a request denied by one descriptor consumes nothing from the others
//! (sluice's all-or-nothing contract, [`crate::algorithm::decide_all`]).

use std::fmt;
use std::sync::Arc;

use crate::key::{LimitKey, RuleName};
use crate::limit::{Limit, MAX_AMOUNT, RawLimit};
use crate::wire::{Check, MAX_CHECKS};

use super::{RlsConfig, RlsRule, Unit};

/// A request, as `envoy.service.ratelimit.v3.RateLimitRequest` carries it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RlsRequest {
    /// The configuration domain.
    pub domain: String,
    /// The descriptors, each decided against its own limit.
    pub descriptors: Vec<RlsDescriptor>,
    /// Units each descriptor consumes when it sets none; 0 means 1.
    pub hits_addend: u32,
}

/// One descriptor of a request. A request holds at most [`MAX_CHECKS`] of them, each asking at
/// most [`MAX_AMOUNT`] hits, as `/v1/decide` allows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RlsDescriptor {
    /// (key, value) entries, outermost first.
    pub entries: Vec<(String, String)>,
    /// The request's own limit for this descriptor, overriding the configuration's.
    pub limit: Option<LimitOverride>,
    /// Units this descriptor consumes (0 only asks), overriding the request's.
    pub hits_addend: Option<u64>,
    /// A refund of hits, which sluice does not take.
    pub is_negative_hits: bool,
}

/// `RateLimitDescriptor.RateLimitOverride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit, as the protobuf enumeration's value.
    pub unit: i32,
}

/// What applies to one descriptor.
#[derive(Debug, Clone)]
pub enum Applied {
    /// No limit matches it.
    NoLimit,
    /// Its limit is `unlimited`.
    Unlimited,
    /// Its limit is replaced by another matched limit's `replaces`.
    Replaced,
    /// It is decided by a check.
    Limited(Planned),
}

/// A descriptor held to a rule.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The rule.
    pub rule: Arc<RlsRule>,
    /// Its stats name (see [`super::Found::stats_key`]).
    pub stats_key: String,
    /// The check sluice decides for it.
    pub check: Check,
}

impl Planned {
    /// A key for the descriptor's counter, unique in the whole configuration (domain included),
    /// the check's key: what a local cache of over-limit counters is keyed by.
    pub fn counter_id(&self) -> &str {
        self.check.key.as_str()
    }
}

/// The rules and checks of one request.
#[derive(Debug, Clone)]
pub struct RlsPlan {
    /// One per descriptor of the request, in its order.
    pub descriptors: Vec<Applied>,
}

impl RlsPlan {
    /// The planned descriptors with their positions, in request order.
    pub fn planned(&self) -> impl Iterator<Item = (usize, &Planned)> {
        self.descriptors
            .iter()
            .enumerate()
            .filter_map(|(i, applied)| match applied {
                Applied::Limited(planned) => Some((i, planned)),
                _ => None,
            })
    }
}

/// A request the service cannot decide: where in it, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsRequestError {
    /// The field, as `descriptors[1].limit.unit`.
    pub path: String,
    /// Why.
    pub reason: String,
}

impl fmt::Display for RlsRequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

impl std::error::Error for RlsRequestError {}

impl RlsConfig {
    /// Which rule applies to each descriptor of `request`, and the check for each that has one.
    pub fn plan(&self, request: &RlsRequest) -> Result<RlsPlan, RlsRequestError> {
        check_request(request)?;
        let known_domain = self.domains.contains_key(&request.domain);
        let mut matched = Vec::with_capacity(request.descriptors.len());
        for (i, descriptor) in request.descriptors.iter().enumerate() {
            check_descriptor(descriptor, i)?;
            let found = match &descriptor.limit {
                Some(limit) if known_domain => Some(override_rule(
                    &request.domain,
                    descriptor,
                    *limit,
                    &format!("descriptors[{i}].limit"),
                )?),
                _ => self.rule_of(&request.domain, &descriptor.entries),
            };
            matched.push(found);
        }
        let replaced: Vec<String> = matched
            .iter()
            .flatten()
            .flat_map(|(rule, _)| rule.replaces.iter().cloned())
            .collect();
        let descriptors = matched
            .into_iter()
            .zip(&request.descriptors)
            .map(|(found, descriptor)| {
                let Some((rule, stats_key)) = found else {
                    return Applied::NoLimit;
                };
                let is_replaced = rule
                    .name
                    .as_deref()
                    .is_some_and(|name| replaced.iter().any(|r| r == name));
                match (&rule.limit, is_replaced) {
                    (None, _) => Applied::Unlimited,
                    (Some(_), true) => Applied::Replaced,
                    (Some(limit), false) => {
                        let check = check_of(request, descriptor, &rule, *limit);
                        Applied::Limited(Planned {
                            rule,
                            stats_key,
                            check,
                        })
                    }
                }
            })
            .collect();
        Ok(RlsPlan { descriptors })
    }
}

fn refused(path: impl Into<String>, reason: impl Into<String>) -> RlsRequestError {
    RlsRequestError {
        path: path.into(),
        reason: reason.into(),
    }
}

/// The request as a whole, refused as the reference service refuses it (its messages).
fn check_request(request: &RlsRequest) -> Result<(), RlsRequestError> {
    if request.domain.is_empty() {
        return Err(refused("domain", "rate limit domain must not be empty"));
    }
    if request.descriptors.is_empty() {
        return Err(refused(
            "descriptors",
            "rate limit descriptor list must not be empty",
        ));
    }
    if request.descriptors.len() > MAX_CHECKS {
        return Err(refused(
            "descriptors",
            format!(
                "at most {MAX_CHECKS} descriptors per request, not {}",
                request.descriptors.len()
            ),
        ));
    }
    if u64::from(request.hits_addend) > MAX_AMOUNT {
        return Err(refused(
            "hits_addend",
            format!("must be at most {MAX_AMOUNT}"),
        ));
    }
    Ok(())
}

/// The `i`th descriptor's own fields.
fn check_descriptor(descriptor: &RlsDescriptor, i: usize) -> Result<(), RlsRequestError> {
    if descriptor.hits_addend.is_some_and(|hits| hits > MAX_AMOUNT) {
        return Err(refused(
            format!("descriptors[{i}].hits_addend"),
            format!("must be at most {MAX_AMOUNT}"),
        ));
    }
    if descriptor.is_negative_hits {
        return Err(refused(
            format!("descriptors[{i}].is_negative_hits"),
            "refunding hits is not supported",
        ));
    }
    Ok(())
}

/// The check sluice decides for a descriptor that `rule` limits by `limit`.
fn check_of(
    request: &RlsRequest,
    descriptor: &RlsDescriptor,
    rule: &RlsRule,
    limit: Limit,
) -> Check {
    let cost = descriptor
        .hits_addend
        .unwrap_or(u64::from(request.hits_addend.max(1)));
    // The domain, then each entry's key and value as parts of their own: escaped and joined,
    // two descriptors share a key only if they are the same. (The reference-style name joins
    // them with `.` and `_`, which `a.c`=`y` and `a` then `c`=`y` share.) Two rules may share a
    // lossy name; their keys differ.
    let key = LimitKey::from_parts(
        std::iter::once(request.domain.as_bytes()).chain(
            descriptor
                .entries
                .iter()
                .flat_map(|(k, v)| [k.as_bytes(), v.as_bytes()]),
        ),
    );
    Check {
        rule: rule.rule_name.clone(),
        key,
        limit,
        cost,
        count_denied: false,
        shadow: rule.shadow_mode,
    }
}

/// The rule of a descriptor that carries its own limit: a fixed window, named as the reference
/// names it (`domain.key_value...`), never shadow, replacing nothing.
fn override_rule(
    domain: &str,
    descriptor: &RlsDescriptor,
    limit: LimitOverride,
    path: &str,
) -> Result<(Arc<RlsRule>, String), RlsRequestError> {
    let error = |field: &str, reason: String| RlsRequestError {
        path: format!("{path}.{field}"),
        reason,
    };
    let unit = Unit::from_proto(limit.unit).ok_or_else(|| {
        error(
            "unit",
            format!(
                "unit {} is not one of SECOND, MINUTE, HOUR, DAY, WEEK or MONTH",
                limit.unit
            ),
        )
    })?;
    let window = unit.window();
    let fixed_window = match limit.requests_per_unit {
        0 => Limit::deny_all(window),
        n => Limit::try_from(RawLimit {
            algorithm: "fixed_window".into(),
            limit: Some(u64::from(n)),
            window: Some(window),
            ..RawLimit::default()
        })
        .map_err(|e| error("requests_per_unit", e.to_string()))?,
    };
    let counter = super::counter_of(
        descriptor
            .entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str())),
    );
    let full_key = format!("{domain}.{counter}");
    let rule = RlsRule {
        rule_name: RuleName::lossy(&full_key),
        full_key: full_key.clone(),
        unit,
        requests_per_unit: u64::from(limit.requests_per_unit),
        limit: Some(fixed_window),
        shadow_mode: false,
        name: None,
        replaces: Vec::new(),
        detailed_metric: false,
    };
    Ok((Arc::new(rule), full_key))
}
