//! How far a rule's decisions stray from the exact limit of its nominal rate, and from the
//! algorithm's own bound.
//!
//! A rule's nominal rate is `units` per `period` (`limit` per `window`, or `rate` per `per`).
//! The exact limit of that rate admits at most `units` in any interval of `period`; it is the
//! sliding log's semantics ([`Limit::exact`]). For each key the report looks at what the rule
//! admitted (a shaped request counts when it was let go) and counts:
//! - requests admitted over the exact limit: their key had more than `units` admitted in the
//!   interval of `period` ending with them;
//! - requests denied under the exact limit: those an exact limiter, given what their key had
//!   admitted, would have admitted too (the mirror image of the above, and a fair measure of
//!   wrongful denials for a key over its limit, where *which* requests get in is a coin toss
//!   that no two limiters toss alike);
//! - requests admitted over the algorithm's own bound for an interval of `period`
//!   ([`Limit::admission_bound`]), plus, for a leased rule, the units its Envoys may hold
//!   (`max_outstanding`, see [`sluice_core::lease`]): never more than zero for a correct
//!   implementation;
//! - what an exact limiter, offered the very same requests, would have done: the requests the
//!   rule denied that it would have admitted, and the other way round;
//! - what the rule's own algorithm would have done deciding each request as it came, exactly,
//!   with one state per key: how far the way it was decided (callouts in flight together,
//!   leases, deny caches) strays from the algorithm itself.
//!
//! With several Envoys, it also replays each instance's share of the requests through the
//! rule's own algorithm, kept per instance: what per-instance (local) limits would have
//! admitted instead of one global limit.

use std::collections::HashMap;

use serde::Serialize;
use sluice_core::algorithm::{Request, State, Update};
use sluice_core::limit::Limit;

/// One request a rule decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    /// When it arrived, µs.
    pub time_us: i64,
    /// Whether the rule admitted it.
    pub admitted: bool,
    /// How long it was held before going on (shaping), ms.
    pub delay_ms: u64,
    /// Which Envoy took it.
    pub instance: usize,
}

impl Offer {
    /// When it went on to the upstream, if it did.
    pub fn admitted_at_us(&self) -> Option<i64> {
        self.admitted
            .then(|| self.time_us + (self.delay_ms as i64) * 1000)
    }
}

/// A rule's limit, as the report needs it.
#[derive(Debug, Clone, Copy)]
pub struct RuleLimit {
    /// The limit.
    pub limit: Limit,
    /// Units each request costs.
    pub cost: u64,
    /// Whether denied requests count.
    pub count_denied: bool,
    /// For a leased rule, the units all Envoys together may hold for a key, which the bound
    /// adds to the algorithm's; 0 otherwise.
    pub lease_allowance: u64,
}

/// The busiest interval of one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Peak {
    /// The key.
    pub key: String,
    /// When the interval ended, µs.
    pub at_us: i64,
    /// Units admitted in it.
    pub admitted: u64,
}

/// What another limiter (the exact one, or the rule's own algorithm decided request by
/// request) would have done with the same requests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ExactComparison {
    /// Requests it would have admitted.
    pub admitted: u64,
    /// Requests the rule denied that it would have admitted.
    pub denied_but_exact_admits: u64,
    /// Requests the rule admitted that it would have denied.
    pub admitted_but_exact_denies: u64,
}

/// What per-instance limits would have admitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PerInstance {
    /// Envoy instances.
    pub instances: usize,
    /// Requests admitted with one limit per instance.
    pub admitted: u64,
}

/// A rule's accuracy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Accuracy {
    /// The nominal rate: units...
    pub units: u64,
    /// ... per this many ms.
    pub period_ms: u64,
    /// Requests the rule decided (admitted or denied; skipped and failed ones aside).
    pub decided: u64,
    /// Of those, admitted.
    pub admitted: u64,
    /// Admitted requests that took their key over `units` in the `period` ending with them.
    pub over_exact: u64,
    /// Denied requests an exact limiter would have admitted, given what their key had
    /// admitted in the `period` ending with them ([`denied_under`]).
    pub denied_under_exact: u64,
    /// The bound on admissions in any interval of `period`: the algorithm's own, plus
    /// `lease_allowance`.
    pub bound: u64,
    /// What leases add to the algorithm's bound (0 for a rule decided per request).
    #[serde(skip_serializing_if = "is_zero")]
    pub lease_allowance: u64,
    /// Admitted requests over that bound.
    pub over_bound: u64,
    /// The busiest interval of `period` of any key.
    pub peak: Option<Peak>,
    /// What an exact limiter would have done (absent when the rate is too large to model).
    pub exact: Option<ExactComparison>,
    /// What the rule's own algorithm would have done, deciding every request in arrival order.
    pub own_algorithm: ExactComparison,
    /// What per-instance limits would have done (with more than one Envoy).
    pub per_instance: Option<PerInstance>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Runs requests through a reference model, one state per key.
struct Model {
    limit: Limit,
    cost: u64,
    count_denied: bool,
    states: HashMap<usize, State>,
}

impl Model {
    fn new(limit: Limit, cost: u64, count_denied: bool) -> Model {
        Model {
            limit,
            cost,
            count_denied,
            states: HashMap::new(),
        }
    }

    fn admits(&mut self, slot: usize, now_us: i64) -> bool {
        let outcome = self.limit.decide(
            self.states.get(&slot),
            Request {
                now_us,
                cost: self.cost,
                count_denied: self.count_denied,
            },
        );
        if let Update::Write { state, .. } = outcome.update {
            self.states.insert(slot, state);
        }
        outcome.verdict.allowed
    }
}

/// The accuracy of one rule, from each key's decided requests in time order.
pub fn assess<'a>(
    rule: &RuleLimit,
    instances: usize,
    keys: impl IntoIterator<Item = (&'a str, &'a [Offer])>,
) -> Accuracy {
    let (units, period) = rule.limit.nominal_rate();
    let period_us = period.as_micros();
    let bound = rule
        .limit
        .admission_bound(period.as_millis())
        .saturating_add(rule.lease_allowance);
    let mut accuracy = Accuracy {
        units,
        period_ms: period.as_millis(),
        decided: 0,
        admitted: 0,
        over_exact: 0,
        denied_under_exact: 0,
        bound,
        lease_allowance: rule.lease_allowance,
        over_bound: 0,
        peak: None,
        exact: rule.limit.exact().map(|_| ExactComparison::default()),
        own_algorithm: ExactComparison::default(),
        per_instance: (instances > 1).then_some(PerInstance {
            instances,
            admitted: 0,
        }),
    };
    for (key, offers) in keys {
        accuracy.decided += offers.len() as u64;
        accuracy.denied_under_exact += denied_under(offers, period_us, rule.cost, units);
        let windows = window_counts(offers, period_us, rule.cost);
        accuracy.admitted += windows.len() as u64;
        for &(at_us, admitted) in &windows {
            accuracy.over_exact += u64::from(admitted > units);
            accuracy.over_bound += u64::from(admitted > bound);
            if accuracy.peak.as_ref().is_none_or(|p| admitted > p.admitted) {
                accuracy.peak = Some(Peak {
                    key: key.to_owned(),
                    at_us,
                    admitted,
                });
            }
        }
        if let (Some(exact), Some(limit)) = (&mut accuracy.exact, rule.limit.exact()) {
            let mut model = Model::new(limit, rule.cost, false);
            for offer in offers {
                let admits = model.admits(0, offer.time_us);
                exact.admitted += u64::from(admits);
                exact.denied_but_exact_admits += u64::from(admits && !offer.admitted);
                exact.admitted_but_exact_denies += u64::from(!admits && offer.admitted);
            }
        }
        let mut own = Model::new(rule.limit, rule.cost, rule.count_denied);
        for offer in offers {
            let admits = own.admits(0, offer.time_us);
            let c = &mut accuracy.own_algorithm;
            c.admitted += u64::from(admits);
            c.denied_but_exact_admits += u64::from(admits && !offer.admitted);
            c.admitted_but_exact_denies += u64::from(!admits && offer.admitted);
        }
        if let Some(local) = &mut accuracy.per_instance {
            let mut model = Model::new(rule.limit, rule.cost, rule.count_denied);
            for offer in offers {
                local.admitted += u64::from(model.admits(offer.instance, offer.time_us));
            }
        }
    }
    accuracy
}

/// The denied requests among `offers` (in time order) that an exact limiter would have
/// admitted, given what was admitted: a denial counts when the units admitted in the
/// `period_us` ending with it (the interval `(t - period, t]`), together with the denials
/// counted so far in that interval, leave room for it. (Counting every denial made while there
/// was room would count, for a key far over its limit, every request denied in the moment one
/// slot was free; an exact limiter would have admitted one of them.)
pub fn denied_under(offers: &[Offer], period_us: i64, cost: u64, units: u64) -> u64 {
    let mut admitted: Vec<i64> = offers.iter().filter_map(Offer::admitted_at_us).collect();
    admitted.sort_unstable();
    let mut counted: std::collections::VecDeque<i64> = std::collections::VecDeque::new();
    let mut total = 0;
    for o in offers.iter().filter(|o| !o.admitted) {
        let t = o.time_us;
        while counted.front().is_some_and(|&c| c <= t - period_us) {
            counted.pop_front();
        }
        let from = admitted.partition_point(|&a| a <= t - period_us);
        let to = admitted.partition_point(|&a| a <= t);
        let in_period = (to - from + counted.len()) as u64 * cost;
        if in_period + cost <= units {
            counted.push_back(t);
            total += 1;
        }
    }
    total
}

/// For each admitted request (in the order they went on), the units its key had admitted in
/// the interval of `period_us` ending with it (the interval `(t - period, t]`, as the sliding
/// log counts).
pub fn window_counts(offers: &[Offer], period_us: i64, cost: u64) -> Vec<(i64, u64)> {
    let mut times: Vec<i64> = offers.iter().filter_map(Offer::admitted_at_us).collect();
    times.sort_unstable();
    let mut oldest = 0;
    times
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            while times[oldest] <= t - period_us {
                oldest += 1;
            }
            (t, (i - oldest + 1) as u64 * cost)
        })
        .collect()
}

/// The units admitted in the interval of `period_us` ending at each moment, as a step
/// function: `(time, units)` at every change, from admission times in order.
pub fn trailing_counts(admitted_us: &[i64], period_us: i64, cost: u64) -> Vec<(i64, u64)> {
    // +cost when a request is admitted, -cost when it leaves the interval.
    let mut changes: Vec<(i64, i64)> = admitted_us
        .iter()
        .flat_map(|&t| [(t, cost as i64), (t + period_us, -(cost as i64))])
        .collect();
    changes.sort_unstable();
    let mut level = 0i64;
    let mut steps: Vec<(i64, u64)> = Vec::new();
    for (t, delta) in changes {
        level += delta;
        match steps.last_mut() {
            Some(last) if last.0 == t => last.1 = level as u64,
            _ => steps.push((t, level as u64)),
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(json: &str) -> RuleLimit {
        RuleLimit {
            limit: serde_json::from_str(json).unwrap(),
            cost: 1,
            count_denied: false,
            lease_allowance: 0,
        }
    }

    fn offer(time_ms: i64, admitted: bool) -> Offer {
        Offer {
            time_us: time_ms * 1000,
            admitted,
            delay_ms: 0,
            instance: 0,
        }
    }

    #[test]
    fn a_fixed_window_boundary_burst_is_over_the_exact_limit_but_within_its_bound() {
        let rule = limit(r#"{"algorithm": "fixed_window", "limit": 3, "window": "1s"}"#);
        // Three at the end of one window, three at the start of the next: six within 200 ms.
        let offers: Vec<Offer> = [900, 950, 999, 1000, 1050, 1100]
            .iter()
            .map(|&t| offer(t, true))
            .collect();
        let a = assess(&rule, 1, [("k", offers.as_slice())]);
        assert_eq!((a.units, a.period_ms, a.bound), (3, 1000, 6));
        assert_eq!((a.admitted, a.over_exact, a.over_bound), (6, 3, 0));
        assert_eq!(a.peak.unwrap().admitted, 6);
        let exact = a.exact.unwrap();
        assert_eq!(
            (exact.admitted, exact.admitted_but_exact_denies),
            (3, 3),
            "the exact limit admits the first three only"
        );
    }

    #[test]
    fn denials_an_exact_limiter_would_have_admitted_are_counted() {
        let rule = limit(r#"{"algorithm": "sliding_window", "limit": 2, "window": "1s"}"#);
        let offers = [offer(0, true), offer(1500, false)];
        let a = assess(&rule, 1, [("k", offers.as_slice())]);
        assert_eq!(a.exact.unwrap().denied_but_exact_admits, 1);
        assert_eq!(a.over_exact, 0);
    }

    #[test]
    fn denials_with_room_under_the_exact_limit_are_counted() {
        let rule = limit(r#"{"algorithm": "fixed_window", "limit": 2, "window": "1s"}"#);
        // Two admitted, a denial while the period is full, then three denied after the first
        // has left: one slot free, so an exact limiter would have admitted one of them.
        let offers = [
            offer(0, true),
            offer(100, true),
            offer(500, false),
            offer(1050, false),
            offer(1060, false),
            offer(1070, false),
        ];
        let a = assess(&rule, 1, [("k", offers.as_slice())]);
        assert_eq!(a.denied_under_exact, 1, "one slot, one wrongful denial");
    }

    #[test]
    fn per_instance_limits_admit_each_instances_share() {
        let rule = limit(r#"{"algorithm": "gcra", "rate": 1, "per": "1s", "burst": 1}"#);
        let offers: Vec<Offer> = (0..4)
            .map(|i| Offer {
                instance: i % 2,
                ..offer(0, i == 0)
            })
            .collect();
        let a = assess(&rule, 2, [("k", offers.as_slice())]);
        assert_eq!(a.admitted, 1, "one global limit");
        assert_eq!(a.per_instance.unwrap().admitted, 2, "one per instance");
    }

    #[test]
    fn trailing_counts_rise_on_admission_and_fall_a_period_later() {
        assert_eq!(
            trailing_counts(&[0, 100, 100], 1000, 1),
            [(0, 1), (100, 3), (1000, 2), (1100, 0)]
        );
    }

    #[test]
    fn shaped_requests_count_when_they_leave() {
        let offers = [
            Offer {
                delay_ms: 500,
                ..offer(0, true)
            },
            offer(100, true),
        ];
        assert_eq!(
            window_counts(&offers, 1_000_000, 1),
            [(100_000, 1), (500_000, 2)]
        );
    }
}
