//! A `ShouldRateLimit` answer from the verdicts of a [`RlsPlan`]'s checks: a status per
//! descriptor, the overall code, the response headers, and the reference service's hit
//! counts, each as envoyproxy/ratelimit makes them (`src/service/ratelimit.go`,
//! `src/limiter/base_limiter.go`).

use crate::decision::{RuleVerdict, rate_limit_headers, seconds};
use crate::policy::HeaderStyle;
use crate::verdict::Verdict;

use super::request::{Applied, Planned, RlsPlan};
use super::{RlsRule, Unit};

/// `RateLimitResponse.Code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Under the limit (or over it in shadow mode, or not limited).
    Ok,
    /// Over the limit.
    OverLimit,
}

/// `RateLimitResponse.RateLimit`: the limit a descriptor was held to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentLimit {
    /// The limit's `name`, or empty.
    pub name: String,
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
}

/// `RateLimitResponse.DescriptorStatus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorStatus {
    /// The descriptor's code.
    pub code: Code,
    /// The limit applied, if any.
    pub current_limit: Option<CurrentLimit>,
    /// Units left; 0 when over the limit; `u32::MAX` for an unlimited descriptor.
    pub limit_remaining: u32,
    /// Until the limit is fully restored, when a limit applied.
    pub until_reset_ms: Option<u64>,
}

/// Which rate limit headers an answer carries for Envoy to add to the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RlsHeaders {
    /// None.
    #[default]
    None,
    /// The reference service's: `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`.
    Reference,
    /// The IETF draft's `RateLimit-Policy` and `RateLimit`.
    Ietf,
}

/// The answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Over the limit when any descriptor is.
    pub overall_code: Code,
    /// One per descriptor, in request order.
    pub statuses: Vec<DescriptorStatus>,
    /// Headers for the response, of the descriptor closest to its limit (or the last one over
    /// it).
    pub headers: Vec<(String, String)>,
}

impl RlsPlan {
    /// The answer, given the verdict of each planned check in [`RlsPlan::planned`] order.
    pub fn answer(&self, verdicts: &[Verdict], headers: RlsHeaders) -> Answer {
        let mut verdict_of = verdicts.iter();
        let mut statuses: Vec<DescriptorStatus> = Vec::with_capacity(self.descriptors.len());
        // The reference's choice of the descriptor whose numbers go in the headers: the one
        // with least left, or the last one over its limit (which has 0 left). Its status's
        // index, its plan and its verdict.
        let mut closest: Option<(usize, &Planned, &Verdict)> = None;
        for applied in &self.descriptors {
            let status = match applied {
                Applied::NoLimit | Applied::Replaced => DescriptorStatus {
                    code: Code::Ok,
                    current_limit: None,
                    limit_remaining: 0,
                    until_reset_ms: None,
                },
                Applied::Unlimited => DescriptorStatus {
                    code: Code::Ok,
                    current_limit: None,
                    limit_remaining: u32::MAX,
                    until_reset_ms: None,
                },
                Applied::Limited(planned) => {
                    let Some(verdict) = verdict_of.next() else {
                        // Fewer verdicts than checks: the caller's bug; answer what is known.
                        break;
                    };
                    let status = status_of(&planned.rule, verdict);
                    let closer = status.code == Code::OverLimit
                        || closest.is_none_or(|(least, _, _)| {
                            status.limit_remaining < statuses[least].limit_remaining
                        });
                    if closer {
                        closest = Some((statuses.len(), planned, verdict));
                    }
                    status
                }
            };
            statuses.push(status);
        }
        let overall_code = if statuses.iter().any(|s| s.code == Code::OverLimit) {
            Code::OverLimit
        } else {
            Code::Ok
        };
        let headers = match closest {
            Some((i, planned, verdict)) => {
                response_headers(headers, planned, verdict, &statuses[i])
            }
            None => Vec::new(),
        };
        Answer {
            overall_code,
            statuses,
            headers,
        }
    }
}

fn status_of(rule: &RlsRule, verdict: &Verdict) -> DescriptorStatus {
    let over = !verdict.allowed;
    DescriptorStatus {
        code: if over && !rule.shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        },
        current_limit: Some(CurrentLimit {
            name: rule.name.clone().unwrap_or_default(),
            requests_per_unit: u32::try_from(rule.requests_per_unit).unwrap_or(u32::MAX),
            unit: rule.unit,
        }),
        limit_remaining: if over {
            0
        } else {
            u32::try_from(verdict.remaining).unwrap_or(u32::MAX)
        },
        until_reset_ms: Some(verdict.reset_ms),
    }
}

fn response_headers(
    style: RlsHeaders,
    planned: &Planned,
    verdict: &Verdict,
    status: &DescriptorStatus,
) -> Vec<(String, String)> {
    match style {
        RlsHeaders::None => Vec::new(),
        RlsHeaders::Reference => {
            vec![
                (
                    "RateLimit-Limit".to_owned(),
                    planned.rule.requests_per_unit.to_string(),
                ),
                (
                    "RateLimit-Remaining".to_owned(),
                    status.limit_remaining.to_string(),
                ),
                (
                    "RateLimit-Reset".to_owned(),
                    seconds(verdict.reset_ms).to_string(),
                ),
            ]
        }
        RlsHeaders::Ietf => rate_limit_headers(
            HeaderStyle::Ietf,
            &RuleVerdict {
                rule: planned.check.rule.as_str(),
                limit: &planned.check.limit,
                shadow: planned.check.shadow,
                verdict,
            },
        ),
    }
}

/// How the reference service counts one descriptor's hits in its stats
/// (`ratelimit.service.rate_limit.<key>.<counter>`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HitCounts {
    /// Every hit.
    pub total_hits: u64,
    /// Hits over the limit.
    pub over_limit: u64,
    /// Hits within the limit but past the near-limit ratio of it.
    pub near_limit: u64,
    /// Hits within the limit.
    pub within_limit: u64,
    /// Over-limit hits of a shadow-mode limit.
    pub shadow_mode: u64,
    /// Over-limit hits decided by the local cache, without Redis.
    pub over_limit_with_local_cache: u64,
}

/// The fraction of a limit past which hits count as near it (the reference's default
/// `NEAR_LIMIT_RATIO`).
pub const NEAR_LIMIT_RATIO: f64 = 0.8;

impl HitCounts {
    /// One descriptor's counts. `consumed` says whether its hits were taken (the request was
    /// allowed); `from_local_cache`, whether the verdict came from the local cache.
    pub fn of(
        planned: &Planned,
        verdict: &Verdict,
        consumed: bool,
        from_local_cache: bool,
    ) -> HitCounts {
        let hits = planned.check.cost;
        let mut counts = HitCounts {
            total_hits: hits,
            ..HitCounts::default()
        };
        let threshold = verdict.limit;
        // Truncated as the reference truncates it.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let near_threshold = (threshold as f64 * NEAR_LIMIT_RATIO).floor() as u64;
        let used = verdict.limit.saturating_sub(verdict.remaining);
        let (before, after) = if verdict.allowed && consumed {
            (used.saturating_sub(hits), used)
        } else {
            (used, used.saturating_add(hits))
        };
        if from_local_cache {
            counts.over_limit = hits;
            counts.over_limit_with_local_cache = hits;
        } else if !verdict.allowed {
            // Only the hits past the limit are over it; the ones before it were near it.
            if before >= threshold || after <= threshold {
                counts.over_limit = hits;
            } else {
                counts.over_limit = after - threshold;
                counts.near_limit = threshold - before.max(near_threshold);
            }
        } else {
            counts.within_limit = hits;
            if after > near_threshold {
                counts.near_limit = if before >= near_threshold {
                    hits
                } else {
                    after - near_threshold
                };
            }
        }
        if planned.rule.shadow_mode && !verdict.allowed {
            counts.shadow_mode = counts.over_limit;
        }
        counts
    }
}
