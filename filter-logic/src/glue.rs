//! What a host gives a request: the clock, counters, the deny cache's and the leases' storage,
//! and the decision's filter state.

use sluice_core::deny_cache::{Entry, EntryId};
use sluice_core::key::LimitKey;
use sluice_core::lease::LeaseConfig;
use sluice_core::policy::{Policy, Rule};
use sluice_core::record::RuleOutcome;

/// What a leased rule's allowance says about one request.
pub enum Local<R> {
    /// The units were taken: admitted; what the server said at the last grant.
    Taken {
        /// To give back if another rule denies the request.
        reservation: R,
        /// The limit's capacity.
        limit: u64,
        /// What the server had left at the last grant.
        remaining: u64,
    },
    /// Denied here: the server has nothing to lease for the key for a while, or the key is
    /// contended and its units are spent at the pace they arrive.
    Denied {
        /// Milliseconds until a request could pass.
        retry_after_ms: u64,
        /// The limit's capacity.
        limit: u64,
    },
    /// No units here: decide it per request.
    NotHeld,
}

impl<R> Local<R> {
    /// The same answer, with the reservation `f` makes of this one's.
    pub fn map_reservation<S>(self, f: impl FnOnce(R) -> S) -> Local<S> {
        match self {
            Local::Taken {
                reservation,
                limit,
                remaining,
            } => Local::Taken {
                reservation: f(reservation),
                limit,
                remaining,
            },
            Local::Denied {
                retry_after_ms,
                limit,
            } => Local::Denied {
                retry_after_ms,
                limit,
            },
            Local::NotHeld => Local::NotHeld,
        }
    }
}

/// One configuration of a filter in its host: what every request of it shares.
pub trait Glue {
    /// Units taken from an allowance for one request, to give back if it is denied.
    type Reservation;

    /// The validated configuration.
    fn policy(&self) -> &Policy;
    /// The host's clock, in microseconds since the epoch.
    fn now_us(&self) -> u64;

    /// Stores the encoded decision (`sluice_core::record`) where access logs read it.
    fn record(&self, decision: &[u8]);
    /// Counts what happened to rule `rule` (an index into the policy's rules); `local` when
    /// it was decided here from a lease.
    fn count_outcome(&self, rule: usize, outcome: RuleOutcome, delayed: bool, local: bool);
    /// Counts a callout sent, carrying the checks of `rules`.
    fn count_callout(&self, rules: impl Iterator<Item = usize>);
    /// Counts a callout that brought no usable answer, and warns of it now and then.
    fn callout_failed(&self, now_us: u64, reason: &str);
    /// Counts a request keyed by its peer's address for an unreadable `x-forwarded-for` entry.
    fn count_client_ip_fallback(&self);

    /// Whether the deny cache is on.
    fn cache_enabled(&self) -> bool;
    /// The live denial of `id`, if the deny cache holds one at `now_ms`.
    fn cache_lookup(&self, id: EntryId<'_>, now_ms: u64) -> Option<Entry>;
    /// Remembers a denial, unless its slot holds one that lasts longer.
    fn cache_remember(&self, entry: &Entry, now_ms: u64);

    /// Takes the units one request of leased rule `rule` (index `rule_index`) costs from
    /// `key`'s allowance, if it holds them.
    fn take_lease(
        &self,
        rule_index: usize,
        rule: &Rule,
        config: &LeaseConfig,
        key: &LimitKey,
        now_us: u64,
    ) -> Local<Self::Reservation>;
    /// Gives back the units of a request that was denied, taken for rule `rule_index`'s
    /// `key`.
    fn give_back(
        &self,
        reservation: &Self::Reservation,
        rule_index: usize,
        key: &LimitKey,
        now_us: u64,
    );
}
