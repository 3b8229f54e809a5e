//! A request as a model of Envoy's own filters decided it: what the native rate limit
//! filter's model and the quota filter's model hand their caller, one per trace record.

use sluice_core::record::RuleRecord;

/// One request, decided.
#[derive(Debug, Clone)]
pub struct Decided {
    /// The trace record's index.
    pub index: usize,
    /// The Envoy that took it.
    pub instance: usize,
    /// What Envoy answered: the upstream's status, the filter's limited or denied status, or
    /// 500 when the rate limit service failed and `failure_mode_deny` is set.
    pub status: u16,
    /// When it arrived.
    pub time_us: i64,
    /// What decided it, a line per rule: per descriptor sent (its path in the service's
    /// configuration, counter and outcome), or the quota bucket's rule and id; none when
    /// nothing applied.
    pub lines: Vec<RuleRecord>,
}
