//! A worker's purse: a few units moved out of a shared [`Allowance`] so that the next requests
//! on the key are decided with no host call at all.
//!
//! In Envoy, reading and compare-and-swapping an allowance in shared data were the largest
//! part of a leased request's cost: the read is a host call that calls back into the module
//! to allocate the copy, the write a second host call (about 19,000 of Envoy's instructions
//! a request under callgrind, against 19,500 for a no-op filter's whole stream). A worker
//! that finds units now takes up to [`PURSE_UNITS`] more into its purse, and spends them
//! there.
//!
//! The bound does not move: a unit leaves the allowance once, by compare-and-swap, and is
//! spent once, from the purse, only while the lease it was granted under lives. What a purse
//! changes is who may spend a unit: units in one worker's purse are not there for another
//! worker, which then asks sooner. So a purse holds at most a quarter of the units it was
//! filled from, and none while the key is paced (units are spent at the server's pace, one
//! compare-and-swap each). A purse unused for a tick goes back to the allowance, with the
//! requests it decided, so that the key's rate, its last use and what it holds are known to
//! the tick that renews or gives back the lease; units of a lease that ended meanwhile are
//! dropped, as the allowance would drop them.

use crate::duration::Millis;

use super::allowance::Allowance;

/// The most units a worker moves into its purse at once.
pub const PURSE_UNITS: u64 = 16;

/// Units of one rule and key at one worker, moved out of the shared allowance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Purse {
    /// Units held and not spent.
    pub units: u64,
    /// The lease they were granted under: spent only before it ends.
    pub lease_until_us: u64,
    /// Units requests decided from the purse took, not yet counted in the allowance's rate.
    pub unobserved: u64,
    /// The last request decided from the purse.
    pub last_used_us: u64,
    /// The key's limit and what the server said remained, for the headers.
    pub limit: u64,
    /// See `limit`.
    pub remaining: u64,
}

impl Purse {
    /// Spends `cost` units at `now_us` if the purse holds them under a live lease.
    pub fn take(&mut self, cost: u64, now_us: u64) -> bool {
        if now_us >= self.lease_until_us || self.units < cost {
            return false;
        }
        self.units -= cost;
        self.unobserved = self.unobserved.saturating_add(cost);
        self.last_used_us = now_us;
        true
    }

    /// Puts back `cost` units of a denied request, taken from this purse under the lease
    /// ending at `lease_until_us`, if that lease still lives; false when they are lost.
    pub fn give_back(&mut self, cost: u64, lease_until_us: u64, now_us: u64) -> bool {
        if lease_until_us != self.lease_until_us || now_us >= self.lease_until_us {
            return false;
        }
        self.units = self.units.saturating_add(cost);
        true
    }

    /// Whether the tick at `now_us` should put it back in its allowance: unused for
    /// `idle_us`, or its lease ends within `margin_us` (after which its units are lost).
    pub fn due_back(&self, now_us: u64, idle_us: u64, margin_us: u64) -> bool {
        now_us.saturating_sub(self.last_used_us) >= idle_us
            || self.lease_until_us <= now_us.saturating_add(margin_us)
    }
}

impl Allowance {
    /// Takes `purse` back at `now_us`: its units, if they are of this allowance's lease and
    /// it still lives, and the requests it decided, as used at its last one.
    pub fn absorb(&mut self, purse: &Purse, now_us: u64, horizon: Millis) {
        if purse.units > 0 && purse.lease_until_us == self.lease_until_us && self.leased(now_us) {
            self.units = self.units.saturating_add(purse.units);
        }
        if purse.unobserved > 0 {
            let last_seen = self.last_seen_us;
            let at = purse.last_used_us.max(self.period_start_us);
            self.observe(purse.unobserved, at, horizon);
            self.last_seen_us = last_seen.max(purse.last_used_us);
        }
    }

    /// Moves units for a purse out of the allowance at `now_us`, after a request took its
    /// own: a quarter of what is left, at most `most` (a worker's purse [`PURSE_UNITS`]);
    /// none while the key is paced or the lease is not live.
    pub fn fill(&mut self, now_us: u64, most: u64) -> Purse {
        let units = if self.pace_us == 0 && self.leased(now_us) {
            (self.units / 4).min(most)
        } else {
            0
        };
        self.units -= units;
        Purse {
            units,
            lease_until_us: self.lease_until_us,
            unobserved: 0,
            last_used_us: now_us,
            limit: self.limit,
            remaining: self.remaining,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Take;
    use crate::wire::LeaseGrant;

    const MS: u64 = 1000;

    fn leased(units: u64, pace_us: u64) -> Allowance {
        let mut a = Allowance::new("r:k");
        let grant = LeaseGrant {
            granted: units,
            lease_ms: 500,
            more_in_ms: 0,
            limit: 1000,
            remaining: 900,
            pace_us,
            kept: None,
            share_per_ks: 0,
            crowded: false,
        };
        a.grant(0, &grant);
        a
    }

    #[test]
    fn a_purse_takes_a_quarter_of_what_is_left_and_at_most_its_size() {
        let mut a = leased(100, 0);
        let p = a.fill(10 * MS, PURSE_UNITS);
        assert_eq!((p.units, a.units), (PURSE_UNITS, 100 - PURSE_UNITS));
        assert_eq!(
            (p.lease_until_us, p.limit, p.remaining),
            (500 * MS, 1000, 900)
        );
        let mut a = leased(20, 0);
        assert_eq!(a.fill(10 * MS, PURSE_UNITS).units, 5);
        let mut a = leased(3, 0);
        assert_eq!(a.fill(10 * MS, PURSE_UNITS).units, 0, "too few to share");
        assert_eq!(a.units, 3);
    }

    #[test]
    fn a_paced_key_or_an_ended_lease_fills_no_purse() {
        let mut a = leased(100, 2 * MS);
        assert_eq!(a.fill(10 * MS, PURSE_UNITS).units, 0);
        let mut a = leased(100, 0);
        assert_eq!(a.fill(500 * MS, PURSE_UNITS).units, 0);
        assert_eq!(a.units, 100, "nothing left the allowance");
    }

    #[test]
    fn a_purse_is_spent_only_under_its_lease() {
        let mut a = leased(100, 0);
        let mut p = a.fill(10 * MS, PURSE_UNITS);
        for t in 0..PURSE_UNITS {
            assert!(p.take(1, (20 + t) * MS));
        }
        assert!(!p.take(1, 40 * MS), "empty");
        let mut p = a.fill(50 * MS, PURSE_UNITS);
        assert!(!p.take(1, 500 * MS), "the lease ended");
        assert!(!p.take(p.units + 1, 60 * MS), "more than it holds");
        assert!(p.take(2, 60 * MS));
        assert_eq!((p.unobserved, p.last_used_us), (2, 60 * MS));
    }

    #[test]
    fn units_given_back_return_only_under_the_lease_they_came_from() {
        let mut a = leased(100, 0);
        let mut p = a.fill(10 * MS, PURSE_UNITS);
        assert!(p.take(1, 20 * MS));
        assert!(p.give_back(1, 500 * MS, 30 * MS));
        assert_eq!(p.units, PURSE_UNITS);
        assert!(!p.give_back(1, 400 * MS, 30 * MS), "another lease");
        assert!(!p.give_back(1, 500 * MS, 500 * MS), "the lease ended");
        assert_eq!(p.units, PURSE_UNITS);
    }

    #[test]
    fn absorbing_returns_units_of_the_same_live_lease_and_counts_the_requests() {
        let h = Millis::new(200).unwrap();
        let mut a = leased(100, 0);
        a.observe(1, 10 * MS, h);
        let mut p = a.fill(10 * MS, PURSE_UNITS);
        for t in 0..5 {
            assert!(p.take(1, (20 + t) * MS));
        }
        let held = a.units;
        a.absorb(&p, 150 * MS, h);
        assert_eq!(a.units, held + PURSE_UNITS - 5);
        assert_eq!(a.seen, 6, "the five requests the purse decided count");
        assert_eq!(
            a.last_seen_us,
            24 * MS,
            "as used at the last, not at the tick"
        );
        assert_eq!(a.take(a.units, 160 * MS), Take::Taken);
    }

    #[test]
    fn a_purse_of_an_older_or_ended_lease_gives_back_no_units() {
        let h = Millis::new(200).unwrap();
        let mut a = leased(100, 0);
        let p = a.fill(10 * MS, PURSE_UNITS);
        let mut renewed = a.clone();
        renewed.lease_until_us = 900 * MS;
        renewed.absorb(&p, 100 * MS, h);
        assert_eq!(renewed.units, a.units, "units of the old lease stay out");
        let mut ended = a.clone();
        ended.absorb(&p, 600 * MS, h);
        assert_eq!(ended.units, a.units);
    }

    #[test]
    fn a_purse_goes_back_when_idle_for_a_tick_or_its_lease_nears_its_end() {
        let mut a = leased(100, 0);
        let p = a.fill(10 * MS, PURSE_UNITS);
        assert!(!p.due_back(50 * MS, 100 * MS, 20 * MS));
        assert!(p.due_back(110 * MS, 100 * MS, 20 * MS), "idle a tick");
        assert!(p.due_back(485 * MS, 1000 * MS, 20 * MS), "lease ending");
    }
}
