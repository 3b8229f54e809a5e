//! Lease mode: units of a rule's limit that sluice-server hands to one Envoy ahead of need, so
//! that Envoy decides most requests itself, with no callout.
//!
//! A lease is taken out of the very Redis state a per-request decision uses, by the same
//! algorithm, atomically, never more than the algorithm would admit at that instant. The Envoy
//! (the *holder*) keeps its units in proxy-wasm shared data, one [`Allowance`] per rule and key,
//! shared by all its workers, and spends them with compare-and-swap, so no unit is spent
//! twice. It asks for more ahead of need, from its observed local rate; it gives back what it
//! does not use. sluice-server keeps a ledger per key: what each holder holds (until its lease
//! ends) and a *pool* of units given back, which the next grant to any holder takes first.
//!
//! # The bound
//!
//! Every unit spent was admitted by the algorithm at the moment it was granted, and a holder
//! spends it later, before its lease ends. So the units admitted in any interval `[a, a + T]`
//! are those granted in it, at most the algorithm's own bound for `T`, plus those granted
//! before `a` and spent after: at most what was outstanding at `a`, which the ledger caps at
//! [`LeaseTerms::max_outstanding`]. **Admissions in any interval `T` are at most the algorithm's
//! bound for `T` plus `max_outstanding`.**
//!
//! What may be denied that a per-request decision would admit: units stranded at a holder
//! whose traffic stopped, until it gives them back as its lease ends (a holder renews the
//! lease of a key it still uses, and gives back the units of one that went quiet); at most
//! `max_units` per holder and key, for at most one `ttl`. A holder that stops
//! without giving back (a crash) strands what it held until the algorithm itself restores it
//! (its window ends, its bucket refills): the server cannot know how much of it was spent.
//!
//! ```
//! use sluice_core::lease::Allowance;
//! let mut a = Allowance::new("per-tenant:acme");
//! // 10 units granted to an ask sent at 0 ms, for a lease of 500 ms.
//! a.grant(10, 0, 500, 0, 100, 90);
//! assert!(a.take(3, 200));
//! assert_eq!(a.units, 7);
//! assert!(!a.take(3, 600), "the lease ended at 500 ms");
//! ```

use serde::{Deserialize, Serialize};

use crate::duration::Millis;

/// Slots of allowances in shared data (direct-mapped, as the deny cache's).
pub const LEASE_SLOTS: u32 = 4096;
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

/// One rule's lease settings, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// How far ahead of need units are asked for: an allowance is refilled when it holds less
    /// than one horizon of the key's local traffic, up to two horizons' worth.
    pub horizon: Millis,
    /// What the server enforces.
    pub terms: LeaseTerms,
}

impl LeaseConfig {
    /// How often a worker looks at its allowances (sends asks and gives back idle units): a
    /// quarter of the horizon, between 5 ms and 100 ms.
    pub fn tick_ms(&self) -> u64 {
        (self.horizon.as_millis() / 4).clamp(5, 100)
    }
}

/// One rule and key's units at one Envoy, as kept in shared data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowance {
    /// `<rule>:<key>` ([`crate::deny_cache::entry_id`]).
    pub id: String,
    /// Units held and not spent.
    pub units: u64,
    /// Host time (ms) until which `units` may be spent; 0: no lease.
    pub lease_until_ms: u64,
    /// Host time until which the server has no unit to lease for the key: requests are denied
    /// locally until then. 0: none.
    pub empty_until_ms: u64,
    /// When a worker sent an ask for this key that is not answered yet; 0: none.
    pub asking_since_ms: u64,
    /// Start of the current counting period (one horizon long).
    pub period_start_ms: u64,
    /// Units requests asked for in the current period.
    pub seen: u64,
    /// ... and in the period before it.
    pub seen_before: u64,
    /// The last time a request used the key.
    pub last_seen_ms: u64,
    /// The key's limit and what the server said remained at the last grant (for headers).
    pub limit: u64,
    /// See `limit`.
    pub remaining: u64,
}

impl Allowance {
    /// An empty allowance for `id`.
    pub fn new(id: &str) -> Allowance {
        Allowance {
            id: id.to_owned(),
            units: 0,
            lease_until_ms: 0,
            empty_until_ms: 0,
            asking_since_ms: 0,
            period_start_ms: 0,
            seen: 0,
            seen_before: 0,
            last_seen_ms: 0,
            limit: 0,
            remaining: 0,
        }
    }

    /// `units|lease_until|empty_until|asking_since|period_start|seen|seen_before|last_seen|
    /// limit|remaining|id` (the id last: it may hold any printable character).
    pub fn encode(&self) -> Vec<u8> {
        format!(
            "{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}",
            self.units,
            self.lease_until_ms,
            self.empty_until_ms,
            self.asking_since_ms,
            self.period_start_ms,
            self.seen,
            self.seen_before,
            self.last_seen_ms,
            self.limit,
            self.remaining,
            self.id
        )
        .into_bytes()
    }

    /// Reads a slot's bytes; `None` for anything malformed (the slot is then free).
    pub fn decode(bytes: &[u8]) -> Option<Allowance> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut fields = text.splitn(11, '|');
        let mut number = || fields.next()?.parse::<u64>().ok();
        let units = number()?;
        let lease_until_ms = number()?;
        let empty_until_ms = number()?;
        let asking_since_ms = number()?;
        let period_start_ms = number()?;
        let seen = number()?;
        let seen_before = number()?;
        let last_seen_ms = number()?;
        let limit = number()?;
        let remaining = number()?;
        Some(Allowance {
            id: fields.next()?.to_owned(),
            units,
            lease_until_ms,
            empty_until_ms,
            asking_since_ms,
            period_start_ms,
            seen,
            seen_before,
            last_seen_ms,
            limit,
            remaining,
        })
    }

    /// Whether its lease is live at `now_ms`.
    pub fn leased(&self, now_ms: u64) -> bool {
        now_ms < self.lease_until_ms
    }

    /// Whether the slot may be given to another key at `now_ms`: nothing held, nothing asked,
    /// no local denial, and unused for `ttl_ms` (so a busy key keeps its slot).
    pub fn is_free(&self, now_ms: u64, ttl_ms: u64) -> bool {
        (self.units == 0 || !self.leased(now_ms))
            && !self.is_asking(now_ms, ttl_ms)
            && now_ms >= self.empty_until_ms
            && now_ms.saturating_sub(self.last_seen_ms) >= ttl_ms
    }

    /// Whether an ask is in flight (one older than `ttl_ms` is taken as lost).
    pub fn is_asking(&self, now_ms: u64, ttl_ms: u64) -> bool {
        self.asking_since_ms != 0 && now_ms.saturating_sub(self.asking_since_ms) < ttl_ms
    }

    /// Counts a request of `cost` at `now_ms` towards the key's local rate.
    pub fn observe(&mut self, cost: u64, now_ms: u64, horizon: Millis) {
        let horizon = horizon.as_millis();
        let elapsed = now_ms.saturating_sub(self.period_start_ms);
        if elapsed >= horizon {
            self.seen_before = if elapsed < 2 * horizon { self.seen } else { 0 };
            self.seen = 0;
            self.period_start_ms = now_ms;
        }
        self.seen = self.seen.saturating_add(cost);
        self.last_seen_ms = now_ms;
    }

    /// The units the key is expected to use in one horizon: the larger of the last full
    /// period's count and the current one's.
    pub fn expected(&self) -> u64 {
        self.seen.max(self.seen_before)
    }

    /// Spends `cost` units if the lease is live and holds them.
    pub fn take(&mut self, cost: u64, now_ms: u64) -> bool {
        if self.leased(now_ms) && self.units >= cost {
            self.units -= cost;
            true
        } else {
            false
        }
    }

    /// Puts back `cost` units taken for a request that was denied by another rule, if the
    /// lease they came from is still live.
    pub fn give_back(&mut self, cost: u64, now_ms: u64) -> bool {
        if self.leased(now_ms) {
            self.units = self.units.saturating_add(cost);
            true
        } else {
            false
        }
    }

    /// The units worth holding: two horizons of the key's local traffic, within `max_units`.
    pub fn target(&self, config: &LeaseConfig) -> u64 {
        (2 * self.expected()).min(config.terms.max_units)
    }

    /// How many units to ask for at `now_ms`, if it is time to ask: when the key is busy
    /// enough to lease (at least two units a horizon), no ask is in flight, and the allowance
    /// holds less than half its [`target`](Allowance::target) (one horizon, when `max_units`
    /// allows two); then up to the target.
    pub fn want(&self, now_ms: u64, config: &LeaseConfig) -> Option<u64> {
        let held = if self.leased(now_ms) { self.units } else { 0 };
        let target = self.target(config);
        let ttl = config.terms.ttl.as_millis();
        if self.expected() < 2
            || 2 * held >= target
            || self.is_asking(now_ms, ttl)
            || now_ms < self.empty_until_ms
        {
            return None;
        }
        Some(target - held)
    }

    /// Applies the server's answer to an ask sent at `asked_at_ms`: `granted` more units, the
    /// lease (all of the holder's units for this key) now ending `lease_ms` after the ask
    /// left; `empty_for_ms` when the server had nothing to lease.
    pub fn grant(
        &mut self,
        granted: u64,
        asked_at_ms: u64,
        lease_ms: u64,
        empty_for_ms: u64,
        limit: u64,
        remaining: u64,
    ) {
        self.units = self.units.saturating_add(granted);
        // The server counts the lease from when it decided, after the ask left: ending it
        // here no later than there, no unit is spent after the server stopped counting it.
        self.lease_until_ms = asked_at_ms.saturating_add(lease_ms);
        if granted == 0 && empty_for_ms > 0 {
            self.empty_until_ms = asked_at_ms.saturating_add(empty_for_ms);
        }
        self.asking_since_ms = 0;
        self.limit = limit;
        self.remaining = remaining;
    }

    /// Takes every unit out, to give them back to the server.
    pub fn take_all(&mut self) -> u64 {
        std::mem::take(&mut self.units)
    }

    /// What to do at `now_ms` with an allowance whose lease ends within `margin_ms`: renew
    /// it while the key is in use (a request in the last half of the lease), give its units
    /// back when the key has gone quiet. `None` while the lease has longer to run, an ask is
    /// in flight, or nothing is held.
    pub fn lease_ending(&self, now_ms: u64, ttl_ms: u64, margin_ms: u64) -> Option<Ending> {
        if self.units == 0
            || self.asking_since_ms != 0
            || self.lease_until_ms > now_ms.saturating_add(margin_ms)
        {
            return None;
        }
        if now_ms.saturating_sub(self.last_seen_ms) < ttl_ms / 2 {
            Some(Ending::Renew)
        } else {
            Some(Ending::GiveBack)
        }
    }
}

/// What a lease about to end needs ([`Allowance::lease_ending`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The key is in use: keep the units, and tell the server so it keeps counting them.
    Renew,
    /// The key has gone quiet: give the units back, for any Envoy's next grant.
    GiveBack,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(horizon_ms: u64, max_units: u64) -> LeaseConfig {
        LeaseConfig {
            horizon: Millis::new(horizon_ms).unwrap(),
            terms: LeaseTerms {
                max_units,
                max_outstanding: max_units * 4,
                ttl: Millis::new(1000).unwrap(),
            },
        }
    }

    #[test]
    fn allowances_round_trip_and_garbage_is_a_free_slot() {
        let mut a = Allowance::new("r:key|with|bars");
        a.grant(5, 100, 1000, 0, 50, 20);
        a.observe(1, 150, Millis::new(200).unwrap());
        assert_eq!(Allowance::decode(&a.encode()), Some(a));
        for bad in [&b""[..], b"1|2", b"x|0|0|0|0|0|0|0|0|0|id", &[0xff, 0xfe]] {
            assert_eq!(Allowance::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_busy_key_asks_for_two_horizons_when_less_than_one_is_left() {
        let c = config(100, 1_000);
        let mut a = Allowance::new("r:k");
        a.observe(1, 0, c.horizon);
        assert_eq!(a.want(0, &c), None, "a key seen once is not leased");
        for t in 1..30 {
            a.observe(1, t, c.horizon);
        }
        assert_eq!(a.want(30, &c), Some(60));
        a.asking_since_ms = 30;
        assert_eq!(a.want(31, &c), None, "one ask at a time");
        a.grant(60, 30, 1_000, 0, 100, 40);
        assert_eq!(a.want(32, &c), None, "two horizons held");
        a.units = 20;
        assert_eq!(a.want(40, &c), Some(40));
        assert_eq!(config(100, 25).horizon.as_millis(), 100);
        a.units = 0;
        assert_eq!(
            a.want(40, &config(100, 25)),
            Some(25),
            "capped by max_units"
        );
    }

    #[test]
    fn the_rate_counts_the_last_full_period() {
        let h = Millis::new(100).unwrap();
        let mut a = Allowance::new("r:k");
        for t in 0..50 {
            a.observe(2, t, h);
        }
        a.observe(1, 120, h);
        assert_eq!((a.seen_before, a.seen, a.expected()), (100, 1, 100));
        a.observe(1, 500, h);
        assert_eq!(a.expected(), 1, "a long silence forgets the old rate");
    }

    #[test]
    fn units_are_spent_only_while_the_lease_lives() {
        let mut a = Allowance::new("r:k");
        a.grant(3, 1_000, 500, 0, 10, 0);
        assert!(a.take(2, 1_200));
        assert!(!a.take(2, 1_200), "one left");
        assert!(a.give_back(2, 1_300));
        assert!(a.take(3, 1_499));
        assert!(!a.give_back(1, 1_500), "the lease ended");
    }

    #[test]
    fn an_empty_answer_denies_locally_until_the_server_said() {
        let c = config(100, 10);
        let mut a = Allowance::new("r:k");
        for t in 0..10 {
            a.observe(1, t, c.horizon);
        }
        a.grant(0, 10, 1_000, 250, 10, 0);
        assert_eq!(a.empty_until_ms, 260);
        assert_eq!(a.want(100, &c), None);
        assert!(a.want(260, &c).is_some());
    }

    #[test]
    fn a_lease_about_to_end_is_renewed_while_used_and_given_back_when_quiet() {
        let h = Millis::new(100).unwrap();
        let mut a = Allowance::new("r:k");
        a.grant(5, 0, 1_000, 0, 10, 0);
        a.observe(1, 10, h);
        assert_eq!(a.lease_ending(500, 1_000, 50), None, "half a lease to run");
        assert_eq!(
            a.lease_ending(960, 1_000, 50),
            Some(Ending::GiveBack),
            "quiet since 10 ms"
        );
        a.observe(1, 700, h);
        assert_eq!(
            a.lease_ending(960, 1_000, 50),
            Some(Ending::Renew),
            "used 260 ms ago"
        );
        a.asking_since_ms = 960;
        assert_eq!(a.lease_ending(970, 1_000, 50), None, "being renewed");
        a.asking_since_ms = 0;
        assert_eq!(a.take_all(), 5);
        assert_eq!(a.lease_ending(970, 1_000, 50), None, "nothing held");
    }
}
