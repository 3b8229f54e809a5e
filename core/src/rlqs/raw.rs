//! sluice's Rate Limit Quota Service configuration exactly as written, before validation. The
//! server reads YAML into these; [`super::RlqsConfig::from_raw`] validates them once.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::duration::Millis;
use crate::limit::RawLimit;

/// One configuration file: a domain (the filter's `domain`) and what its buckets get.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRlqsConfig {
    /// The domain Envoy's `rate_limit_quota` filter sends in every report.
    #[serde(default)]
    pub domain: String,
    /// Rules, tried in order: the first whose `match` a bucket id meets gives its quota.
    #[serde(default)]
    pub buckets: Vec<RawBucketRule>,
    /// What a bucket no rule matches gets (default: `allow: all`): a rule without `match`.
    #[serde(default)]
    pub default: Option<RawBucketRule>,
    /// A bucket no Envoy has used for this long is abandoned: the server tells the Envoys to
    /// forget it (`abandon_action`) and keeps no state for it (default: 5m).
    #[serde(default)]
    pub idle_after: Option<Millis>,
}

/// Which bucket ids a rule covers, and what each of them gets.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBucketRule {
    /// Entries the bucket id must hold: each value exact, or with `*` standing for any run of
    /// characters (`"*"` alone: any value). Keys the rule does not name may be present.
    #[serde(rename = "match", default)]
    pub matches: BTreeMap<String, String>,
    /// The rule's name, in metrics and in the Redis keys of its buckets (default: `bucket<i>`).
    #[serde(default)]
    pub name: Option<String>,
    /// A sluice limit for each bucket id the rule covers; each bucket id is a limit of its own.
    /// One of `limit`, `allow` and `deny`.
    #[serde(default)]
    pub limit: Option<RawLimit>,
    /// `all`: every request allowed, no limit kept.
    #[serde(default)]
    pub allow: Option<String>,
    /// `all`: every request denied.
    #[serde(default)]
    pub deny: Option<String>,
    /// How a bucket's limit is shared among the Envoys that report it: `demand` (by what each
    /// one used, the default) or `equal`.
    #[serde(default)]
    pub share: Option<String>,
}
