//! The units one Envoy holds of one rule and key: the record its workers share; what is done
//! with it is in [`super`] (asks, grants, ending leases) and [`super::purse`] (spending).

/// One rule and key's units at one Envoy, as kept in shared data. Times are host time in
/// microseconds since the epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowance {
    /// `<rule>:<key>` ([`crate::deny_cache::entry_id`]).
    pub id: String,
    /// Units held and not spent.
    pub units: u64,
    /// Until when `units` may be spent; 0: no lease.
    pub lease_until_us: u64,
    /// When the server expects to have more for the key (it granted less than asked): no ask
    /// before then, and requests that find no unit here are denied locally. 0: none.
    pub next_ask_us: u64,
    /// When a worker sent an ask for this key that is not answered yet; 0: none.
    pub asking_since_us: u64,
    /// Start of the current counting period (one horizon long).
    pub period_start_us: u64,
    /// Units requests asked for in the current period.
    pub seen: u64,
    /// ... and in the period before it.
    pub seen_before: u64,
    /// The last time a request used the key.
    pub last_seen_us: u64,
    /// While the key is over its limit, this Envoy's fair share of the limit's rate, as the
    /// server computed it: microseconds between units. 0: spend as requests come.
    pub pace_us: u64,
    /// The pace's theoretical arrival time: when the next unit is due.
    pub pace_next_us: u64,
    /// The key's limit and what the server said remained at the last grant (for headers).
    pub limit: u64,
    /// See `limit`.
    pub remaining: u64,
}
