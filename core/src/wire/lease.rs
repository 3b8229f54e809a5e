//! `POST /v1/lease`: one holder's asks for units of keys' limits, and the grants that answer
//! them, each held within the terms it was asked under.

use serde::{Deserialize, Serialize};

use super::{MAX_ASKS, MAX_HOLDER_LEN, WireError, parse_with_path};
use crate::duration::Millis;
use crate::key::{LimitKey, RuleName};
use crate::limit::{Limit, MAX_AMOUNT};

/// The longest lease.
pub const MAX_LEASE_TTL_MS: u64 = 60_000;

/// What the server enforces for one key's leases; sent with every ask (the server keeps no
/// configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseTerms {
    /// The most units one holder may hold for the key.
    pub max_units: u64,
    /// The most units all holders together (and the pool of units given back) may hold for
    /// the key: what the bound adds to the algorithm's.
    pub max_outstanding: u64,
    /// How long a lease lasts after the holder's last call.
    pub ttl: Millis,
}

/// Every lease ask of one holder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// Who holds the leases: one Envoy, named the same by all its workers; 1 to 128 of
    /// `A-Z a-z 0-9 _ . : -`.
    pub holder: String,
    /// A secret the holder chose (unguessable: 16 random bytes or more), the same in all its
    /// requests; up to 64 of `A-Z a-z 0-9 _ -`. The first ask that puts the holder in a key's
    /// ledger binds it there, and while that entry lives, an ask naming the holder with
    /// another secret is refused: nobody else can give back or disown the units the holder
    /// still spends. Empty (the default) binds the empty secret.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret: String,
    /// The asks, one per rule and key.
    pub asks: Vec<LeaseAsk>,
}

/// One rule and key's ask: report what is held, give back what is not needed, ask for more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseAsk {
    /// The rule.
    pub rule: RuleName,
    /// The escaped key within that rule.
    pub key: LimitKey,
    /// The rule's limit.
    pub limit: Limit,
    /// The caps the server enforces.
    pub terms: LeaseTerms,
    /// Units wanted now (0: only report, give back, or keep the lease alive).
    #[serde(default)]
    pub want: u64,
    /// Units the holder still holds, unspent (not counting `returning`).
    #[serde(default)]
    pub held: u64,
    /// Units the holder gives back: it will never spend them.
    #[serde(default)]
    pub returning: u64,
    /// Units a second the holder's requests ask for (its local demand), from which the server
    /// shares the limit's rate among holders when the key is over it.
    #[serde(default)]
    pub demand: u64,
    /// When set, the holder takes a share of the limit's rate however little it asks for:
    /// its max-min fair share, with what the holders' demands leave over split evenly among
    /// them, granted for this many milliseconds at most (the quota service funds each refill
    /// of an Envoy's token bucket so). 0: the holder asks for units as it needs them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub share_span_ms: u64,
    /// When not 0, the holder's demand in units a thousand seconds, finer than `demand` (which
    /// it then supersedes): the quota service's, from what an Envoy reports.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub demand_per_ks: u64,
    /// With a `share_span_ms`: thousandths of a unit of the holder's share that its earlier
    /// grants, made in whole units, left over. Added to its share over the span before that is
    /// cut to whole units, so that a share of 4.2 a second is granted 4, 4, 4, 4 and 5.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub carry_per_k: u64,
    /// The most holders the key's ledger may name at once; 0: no cap. When it names that many
    /// and not this holder, the ask is given nothing and claims no share
    /// ([`LeaseGrant::crowded`]). The quota service caps its Envoys' streams on a bucket so, as
    /// a client opening stream after stream would otherwise lengthen the ledger every funding
    /// reads.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_holders: u64,
}

impl LeaseAsk {
    /// Its demand in units a thousand seconds.
    pub fn demand_per_ks(&self) -> u64 {
        if self.demand_per_ks > 0 {
            self.demand_per_ks
        } else {
            self.demand.saturating_mul(1000)
        }
    }
}

/// The whole units a share grants over a span, and the thousandths of a unit it carries to the
/// next: the share (units a thousand seconds, as [`LeaseGrant::share_per_ks`] says it) over the
/// span, plus what the last grants carried, cut to whole units. `lua/ledger.lua` makes the
/// same cut.
pub fn share_over_span(share_per_ks: u64, span_ms: u64, carry_per_k: u64) -> (u64, u64) {
    let thousandths = (share_per_ks.saturating_mul(span_ms) / 1000).saturating_add(carry_per_k);
    (thousandths / 1000, thousandths % 1000)
}

/// The answers, one per ask, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseResponse {
    /// `grants[i]` answers `asks[i]`.
    pub grants: Vec<LeaseGrant>,
}

/// What the server gave one ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseGrant {
    /// New units for the holder (from units given back by holders first, then from the
    /// algorithm).
    pub granted: u64,
    /// The holder's whole lease on the key (old units and new) ends this long after the call.
    pub lease_ms: u64,
    /// When less was granted than wanted because the algorithm admits no more now: how long
    /// until it admits the rest. The holder asks again no sooner, and, holding nothing, denies
    /// requests meanwhile. 0 otherwise (granted in full, or held back by a cap).
    #[serde(default)]
    pub more_in_ms: u64,
    /// The limit's capacity.
    pub limit: u64,
    /// What the algorithm had left after the grant.
    pub remaining: u64,
    /// When the holders' demands add up to more than a bucket's rate: the holder's max-min
    /// fair share of the rate, as microseconds between units; the holder spends no faster, so
    /// that the key's admissions, summed over holders, are as even as the algorithm's. 0:
    /// spend freely (within the rate, or a window algorithm, which admits in bursts by
    /// design).
    #[serde(default)]
    pub pace_us: u64,
    /// When the server counted fewer of the units the ask said were held than it said (their
    /// lease had already ended there, or Redis lost the ledger): how many it still counts.
    /// The holder keeps no more of them than this. Absent when it counted them all, as it
    /// does unless a renewal comes late.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<u64>,
    /// For an ask with a `share_span_ms`: the holder's share of the limit's rate, in units a
    /// thousand seconds. 0 otherwise.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub share_per_ks: u64,
    /// The key's ledger named as many holders as the ask's `max_holders`, and not this one:
    /// nothing was granted, no share claimed, and `more_in_ms` says when the first of those
    /// holders' entries ends, if it is not renewed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub crowded: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The longest holder secret.
pub const MAX_SECRET_LEN: usize = 64;

fn is_secret(secret: &str) -> bool {
    secret.len() <= MAX_SECRET_LEN
        && secret
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
}

/// Whether a holder name may hold `b`: `A-Z a-z 0-9 _ . : -`.
fn is_holder_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"_.:-".contains(&b)
}

fn is_holder(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_HOLDER_LEN && name.bytes().all(is_holder_byte)
}

/// An Envoy's holder name: its node id (each byte a name may not hold, and `:`, made `-`; at
/// most 64; `envoy` for none), `:`, and `started` in hex, so that a restarted Envoy is a new
/// holder.
pub fn holder_name(node: &[u8], started: u128) -> String {
    let node: String = node
        .iter()
        .take(64)
        .map(|&b| {
            if b != b':' && is_holder_byte(b) {
                char::from(b)
            } else {
                '-'
            }
        })
        .collect();
    let node = if node.is_empty() { "envoy" } else { &node };
    format!("{node}:{started:x}")
}

/// A holder secret made of 16 random bytes, in hex.
pub fn holder_secret(random: [u8; 16]) -> String {
    format!("{:032x}", u128::from_be_bytes(random))
}

/// Why a lease's terms or limit cannot be leased; `None` when they can.
pub fn lease_refusal(limit: &Limit, terms: &LeaseTerms) -> Option<String> {
    if limit.shapes() {
        return Some(
            "a shaping leaky bucket cannot be leased: each request needs its own delay".into(),
        );
    }
    if terms.max_units == 0 || terms.max_units > terms.max_outstanding {
        return Some(format!(
            "`max_units` must be between 1 and `max_outstanding` ({}), not {}",
            terms.max_outstanding, terms.max_units
        ));
    }
    if terms.max_outstanding > MAX_AMOUNT {
        return Some(format!(
            "`max_outstanding` must be at most {MAX_AMOUNT}, not {}",
            terms.max_outstanding
        ));
    }
    if terms.ttl.as_millis() > MAX_LEASE_TTL_MS {
        return Some(format!("`ttl` must be at most 1m, not {}", terms.ttl));
    }
    None
}

impl LeaseRequest {
    /// Parses and validates a request body; the error names the field and the reason.
    pub fn from_json(body: &[u8]) -> Result<LeaseRequest, WireError> {
        let request: LeaseRequest = parse_with_path(body)?;
        if !is_holder(&request.holder) {
            return Err(WireError::at(
                "holder",
                format!(
                    "`{}` is not a holder name: use 1 to 128 of A-Z a-z 0-9 _ . : -",
                    request.holder
                ),
            ));
        }
        if !is_secret(&request.secret) {
            return Err(WireError::at(
                "secret",
                format!("must be at most {MAX_SECRET_LEN} of A-Z a-z 0-9 _ -"),
            ));
        }
        if request.asks.is_empty() || request.asks.len() > MAX_ASKS {
            return Err(WireError::at(
                "asks",
                format!("must hold 1 to {MAX_ASKS} asks, not {}", request.asks.len()),
            ));
        }
        for (i, ask) in request.asks.iter().enumerate() {
            if let Some(reason) = lease_refusal(&ask.limit, &ask.terms) {
                return Err(WireError::at(format!("asks[{i}]"), reason));
            }
            if ask.share_span_ms > MAX_LEASE_TTL_MS {
                return Err(WireError::at(
                    format!("asks[{i}].share_span_ms"),
                    format!(
                        "must be at most {MAX_LEASE_TTL_MS}, not {}",
                        ask.share_span_ms
                    ),
                ));
            }
            if ask.demand > MAX_AMOUNT {
                return Err(WireError::at(
                    format!("asks[{i}].demand"),
                    format!("must be at most {MAX_AMOUNT}, not {}", ask.demand),
                ));
            }
            for (field, value) in [
                ("want", ask.want),
                ("held", ask.held),
                ("returning", ask.returning),
            ] {
                if value > ask.terms.max_units {
                    return Err(WireError::at(
                        format!("asks[{i}].{field}"),
                        format!(
                            "must be at most terms.max_units ({}), not {value}",
                            ask.terms.max_units
                        ),
                    ));
                }
            }
            if let Some(first) = request.asks[..i]
                .iter()
                .position(|a| a.rule == ask.rule && a.key == ask.key)
            {
                return Err(WireError::at(
                    format!("asks[{i}]"),
                    format!(
                        "rule `{}` with key `{}` is already asks[{first}]",
                        ask.rule, ask.key
                    ),
                ));
            }
        }
        Ok(request)
    }

    /// The request's body. Its fields are strings, numbers and lists of them, which JSON
    /// always encodes.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses the response to this request, checking that it answers every ask within what
    /// was asked: no more units than wanted, no lease longer than the terms' `ttl`. A holder
    /// that took more would break the bound the terms promise, so such an answer is refused
    /// whole.
    pub fn parse_response(&self, body: &[u8]) -> Result<LeaseResponse, WireError> {
        let response: LeaseResponse = serde_json::from_slice(body)
            .map_err(|e| WireError::at("response body", e.to_string()))?;
        if response.grants.len() != self.asks.len() {
            return Err(WireError::at(
                "response body",
                format!(
                    "{} grants for {} asks",
                    response.grants.len(),
                    self.asks.len()
                ),
            ));
        }
        for (i, (ask, grant)) in self.asks.iter().zip(&response.grants).enumerate() {
            if grant.granted > ask.want {
                return Err(WireError::at(
                    "response body",
                    format!(
                        "grants[{i}].granted is {}, more than the {} asked",
                        grant.granted, ask.want
                    ),
                ));
            }
            if let Some(kept) = grant.kept
                && kept > ask.held
            {
                return Err(WireError::at(
                    "response body",
                    format!(
                        "grants[{i}].kept is {kept}, more than the {} held",
                        ask.held
                    ),
                ));
            }
            if grant.lease_ms > ask.terms.ttl.as_millis() {
                return Err(WireError::at(
                    "response body",
                    format!(
                        "grants[{i}].lease_ms is {}, longer than the terms' ttl ({})",
                        grant.lease_ms, ask.terms.ttl
                    ),
                ));
            }
        }
        Ok(response)
    }
}
