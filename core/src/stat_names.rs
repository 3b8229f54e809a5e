//! The names of the filter's stats in Envoy (which shows them prefixed `wasmcustom.`): the
//! filter defines them, and the simulator's reports and tests read them by these names.

use crate::record::RuleOutcome;
use crate::wire::LeaseGrant;

/// Callouts sent to `/v1/decide`.
pub const CALLOUTS: &str = "sluice.callouts";
/// Callouts that brought no usable answer.
pub const CALLOUT_FAILURES: &str = "sluice.callout_failures";
/// Lease callouts sent.
pub const LEASE_CALLS: &str = "sluice.lease_calls";
/// Lease callouts the host refused.
pub const LEASE_CALL_FAILURES: &str = "sluice.lease_call_failures";
/// Requests keyed by the peer's address for an unreadable `x-forwarded-for` entry.
pub const CLIENT_IP_FALLBACKS: &str = "sluice.client_ip_fallbacks";
/// Requests decided by the failure mode after a panic in the module's code (the module only:
/// in the .wasm, a panic traps the VM, and Envoy's `failure_policy` decides).
pub const PANICS: &str = "sluice.panics";

/// One rule's stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleStat {
    /// Requests the rule allowed.
    Allowed,
    /// Requests the rule denied.
    Denied,
    /// Requests the rule would have denied, in shadow mode.
    ShadowDenied,
    /// Requests the rule's failure mode decided.
    Failures,
    /// Requests the deny cache denied for the rule.
    CacheHits,
    /// Requests held for shaping.
    Shaped,
    /// Requests whose check for the rule went to sluice-server.
    Callouts,
    /// Requests decided in Envoy from a lease (also counted as allowed or denied).
    Local,
    /// Lease asks answered.
    LeaseAsks,
    /// Units granted.
    LeaseUnits,
    /// Answers with nothing to lease.
    LeaseEmpty,
    /// Lease asks that got no answer.
    LeaseFailures,
}

impl RuleStat {
    /// Every rule stat, in declaration order (so `ALL[stat as usize] == stat`).
    pub const ALL: [RuleStat; 12] = [
        RuleStat::Allowed,
        RuleStat::Denied,
        RuleStat::ShadowDenied,
        RuleStat::Failures,
        RuleStat::CacheHits,
        RuleStat::Shaped,
        RuleStat::Callouts,
        RuleStat::Local,
        RuleStat::LeaseAsks,
        RuleStat::LeaseUnits,
        RuleStat::LeaseEmpty,
        RuleStat::LeaseFailures,
    ];

    /// The stat's last segment.
    pub fn suffix(self) -> &'static str {
        match self {
            RuleStat::Allowed => "allowed",
            RuleStat::Denied => "denied",
            RuleStat::ShadowDenied => "shadow_denied",
            RuleStat::Failures => "failures",
            RuleStat::CacheHits => "cache_hits",
            RuleStat::Shaped => "shaped",
            RuleStat::Callouts => "callouts",
            RuleStat::Local => "local",
            RuleStat::LeaseAsks => "lease_asks",
            RuleStat::LeaseUnits => "lease_units",
            RuleStat::LeaseEmpty => "lease_empty",
            RuleStat::LeaseFailures => "lease_failures",
        }
    }
}

/// The stats that count what came of one check of a rule: its outcome's own (none for a
/// skipped check), with [`RuleStat::Local`] when it was decided from a lease, and
/// [`RuleStat::Shaped`] when it was held.
///
/// Three slots in a loop the compiler unrolls: this runs for every check of every request,
/// and a chain of three options cost the native module's leased request 37 instructions more
/// (callgrind).
#[inline]
pub fn outcome_stats(
    outcome: RuleOutcome,
    delayed: bool,
    local: bool,
) -> impl Iterator<Item = RuleStat> {
    let own = match outcome {
        RuleOutcome::Allowed => Some(RuleStat::Allowed),
        RuleOutcome::Denied => Some(RuleStat::Denied),
        RuleOutcome::ShadowDenied => Some(RuleStat::ShadowDenied),
        RuleOutcome::CachedDeny => Some(RuleStat::CacheHits),
        RuleOutcome::Failed => Some(RuleStat::Failures),
        RuleOutcome::Skipped => None,
    };
    let local = (local && own.is_some()).then_some(RuleStat::Local);
    [local, own, delayed.then_some(RuleStat::Shaped)]
        .into_iter()
        .flatten()
}

/// The stats that count one lease ask and its grant (`None`: the ask got no usable answer),
/// each with the amount to add.
pub fn lease_answer_stats(grant: Option<&LeaseGrant>) -> impl Iterator<Item = (RuleStat, u64)> {
    let stats = match grant {
        None => [Some((RuleStat::LeaseFailures, 1)), None, None],
        Some(grant) => [
            Some((RuleStat::LeaseAsks, 1)),
            Some((RuleStat::LeaseUnits, grant.granted)),
            (grant.granted == 0 && grant.more_in_ms > 0).then_some((RuleStat::LeaseEmpty, 1)),
        ],
    };
    stats.into_iter().flatten()
}

/// The name of `stat` of rule `rule`: `sluice.rule.<rule>.<stat>`.
pub fn rule_stat(rule: &str, stat: RuleStat) -> String {
    format!("sluice.rule.{rule}.{}", stat.suffix())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_documented_ones() {
        assert_eq!(
            rule_stat("per-ip", RuleStat::ShadowDenied),
            "sluice.rule.per-ip.shadow_denied"
        );
        assert_eq!(CALLOUTS, "sluice.callouts");
    }

    #[test]
    fn a_check_counts_its_outcome_with_local_and_shaped_when_they_apply() {
        let stats = |outcome, delayed, local| -> Vec<RuleStat> {
            outcome_stats(outcome, delayed, local).collect()
        };
        use RuleStat::*;
        assert_eq!(stats(RuleOutcome::Allowed, false, false), [Allowed]);
        assert_eq!(stats(RuleOutcome::Allowed, false, true), [Local, Allowed]);
        assert_eq!(
            stats(RuleOutcome::Allowed, true, true),
            [Local, Allowed, Shaped]
        );
        assert_eq!(stats(RuleOutcome::Denied, false, true), [Local, Denied]);
        assert_eq!(stats(RuleOutcome::CachedDeny, false, false), [CacheHits]);
        assert_eq!(stats(RuleOutcome::Failed, false, false), [Failures]);
        // A skipped check consumed nothing: not even `local` counts it.
        assert_eq!(stats(RuleOutcome::Skipped, false, true), []);
    }

    #[test]
    fn all_lists_every_stat_at_its_own_index() {
        for (i, stat) in RuleStat::ALL.into_iter().enumerate() {
            assert_eq!(stat as usize, i, "{stat:?}");
        }
    }
}
