//! What the tick's passes and the takes at once share: the bench's leased rule, its keys,
//! the leases as the module keeps them, and the server's grants.

use std::borrow::Cow;
use std::time::Duration;

use sluice_core::key::LimitKey;
use sluice_core::lease::LeaseConfig;
use sluice_core::policy::{HttpRequest, Policy, Rule};
use sluice_core::wire::{LeaseAsk, LeaseGrant};
use sluice_filter_logic::lease::{Holder, LeaseTick, Leases};
use sluice_filter_logic::shared_data::SharedData;

/// One rule, leased, keyed by the request's `x-api-key`.
pub const POLICY: &str = r#"{"cluster": "sluice", "rules": [{"name": "per-tenant",
  "key": [{"header": "x-api-key"}],
  "limit": {"algorithm": "gcra", "rate": 1000, "per": "1s", "burst": 1000},
  "lease": {"horizon": "500ms"}}]}"#;

/// [`POLICY`]'s one rule and its lease.
pub fn leased_rule(policy: &Policy) -> anyhow::Result<(&Rule, &LeaseConfig)> {
    let rule = policy
        .rules
        .first()
        .ok_or_else(|| anyhow::anyhow!("the bench's policy has no rule"))?;
    let config = rule
        .lease
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("the bench's rule has no lease"))?;
    Ok((rule, config))
}

/// The bench drives the tick by hand.
pub struct ByHand;

impl LeaseTick for ByHand {
    fn set_leasing(&self, _period: Option<Duration>) {}
}

/// The key `policy`'s rule gives tenant number `tenant`'s requests.
pub fn key_of(policy: &Policy, tenant: usize) -> anyhow::Result<LimitKey> {
    let request = HttpRequest {
        headers: [(
            Cow::Borrowed("x-api-key"),
            Cow::Owned(format!("tenant-{tenant}").into_bytes()),
        )]
        .into_iter()
        .collect(),
        source_address: None,
    };
    let mut plan = policy.plan(&request);
    anyhow::ensure!(
        !plan.checks.is_empty(),
        "the bench's rule matched no request"
    );
    Ok(plan.checks.remove(0).key)
}

/// One set of leases over `data`, for `policy`'s rules, as the module keeps them: the whole
/// process's.
pub fn module_leases<D: SharedData>(data: D, policy: &Policy) -> Leases<D, ByHand> {
    Leases::new(
        data,
        "bench".to_owned(),
        Holder {
            name: "envoy:1".to_owned(),
            secret: "s".to_owned(),
        },
        &policy.rules,
        ByHand,
    )
    .process_wide()
}

/// Grants for `asks`: each `granted(ask)` units for `lease_ms`, at its limit, unpaced.
pub fn grant_each(
    asks: &[LeaseAsk],
    granted: impl Fn(&LeaseAsk) -> u64,
    lease_ms: u64,
) -> Vec<LeaseGrant> {
    asks.iter()
        .map(|ask| LeaseGrant {
            granted: granted(ask),
            lease_ms,
            more_in_ms: 0,
            limit: ask.limit.capacity(),
            remaining: ask.limit.capacity(),
            pace_us: 0,
            kept: None,
            share_per_ks: 0,
            crowded: false,
        })
        .collect()
}
