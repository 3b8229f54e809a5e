//! Descriptors of one request that name the same counter, decided as one check.
//!
//! Envoy may send the same descriptor twice in one `ShouldRateLimit` (two route actions that
//! produce it). The reference counts each: both add their hits, and the one that goes over is
//! OVER_LIMIT. Decided as two checks of one key, the second would be asked before the first
//! consumed, and the all-or-nothing rule could not hold (one unit left: the statuses came out
//! OVER then OK, and the unit was spent). So the checks of one counter go to Redis as one, of
//! their summed cost, and the verdict is split back: in request order, each is within the limit
//! while the units asked so far fit, and OVER_LIMIT from the first that does not; a request
//! with any OVER_LIMIT consumes nothing.

use crate::verdict::Verdict;
use crate::wire::Check;

/// The checks to decide, one per counter, and which of them each original check is.
#[derive(Debug, Clone)]
pub struct Merged {
    /// One check per counter, its cost the sum of its members'.
    pub checks: Vec<Check>,
    /// For each original check, the index of its merged check.
    member_of: Vec<usize>,
    /// Each original check's cost.
    costs: Vec<u64>,
}

impl Merged {
    /// `checks`, those of one counter (same rule, key, limit and flags) merged.
    pub fn of(checks: Vec<Check>) -> Merged {
        let mut merged: Vec<Check> = Vec::with_capacity(checks.len());
        let mut member_of = Vec::with_capacity(checks.len());
        let mut costs = Vec::with_capacity(checks.len());
        for check in checks {
            costs.push(check.cost);
            let same = merged.iter().position(|m| {
                m.rule == check.rule
                    && m.key == check.key
                    && m.limit == check.limit
                    && m.count_denied == check.count_denied
                    && m.shadow == check.shadow
            });
            match same {
                Some(at) => {
                    merged[at].cost = merged[at].cost.saturating_add(check.cost);
                    member_of.push(at);
                }
                None => {
                    member_of.push(merged.len());
                    merged.push(check);
                }
            }
        }
        Merged {
            checks: merged,
            member_of,
            costs,
        }
    }

    /// Each original check's verdict, from the merged checks' `verdicts`; `None` if they are
    /// fewer than the merged checks. It needs only the verdicts, so [`Self::checks`] may have
    /// been taken to send them.
    pub fn split(&self, verdicts: &[Verdict]) -> Option<Vec<Verdict>> {
        let mut asked_so_far = vec![0u64; verdicts.len()];
        self.member_of
            .iter()
            .zip(&self.costs)
            .map(|(&at, &cost)| {
                let verdict = *verdicts.get(at)?;
                asked_so_far[at] = asked_so_far[at].saturating_add(cost);
                if verdict.allowed || asked_so_far[at] > verdict.remaining {
                    return Some(verdict);
                }
                // The counter denied the sum, but this one's units, with those before it, fit.
                Some(Verdict {
                    allowed: true,
                    remaining: verdict.remaining - asked_so_far[at],
                    retry_after_ms: Some(0),
                    ..verdict
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Merged;
    use crate::verdict::Verdict;
    use crate::wire::Check;

    fn check(key: &str, cost: u64) -> Check {
        serde_json::from_value(serde_json::json!({
            "rule": "d.k", "key": key, "cost": cost,
            "limit": {"algorithm": "fixed_window", "limit": 10, "window": "1m"}
        }))
        .unwrap()
    }

    fn verdict(allowed: bool, remaining: u64) -> Verdict {
        Verdict {
            allowed,
            limit: 10,
            remaining,
            reset_ms: 60_000,
            retry_after_ms: Some(if allowed { 0 } else { 60_000 }),
            delay_ms: 0,
        }
    }

    #[test]
    fn checks_of_one_counter_are_asked_as_one_of_their_summed_cost() {
        let merged = Merged::of(vec![check("a", 1), check("b", 1), check("a", 2)]);
        let costs: Vec<(String, u64)> = merged
            .checks
            .iter()
            .map(|c| (c.key.as_str().to_owned(), c.cost))
            .collect();
        assert_eq!(costs, [("a".to_owned(), 3), ("b".to_owned(), 1)]);
    }

    #[test]
    fn a_denied_sum_is_split_back_in_request_order() {
        // One unit left; the same descriptor twice: the first fits, the second goes over.
        let merged = Merged::of(vec![check("a", 1), check("a", 1)]);
        let split = merged.split(&[verdict(false, 1)]).unwrap();
        let shown: Vec<(bool, u64)> = split.iter().map(|v| (v.allowed, v.remaining)).collect();
        assert_eq!(shown, [(true, 0), (false, 1)]);
    }

    #[test]
    fn an_allowed_sum_allows_each() {
        let merged = Merged::of(vec![check("a", 1), check("b", 1), check("a", 1)]);
        let split = merged.split(&[verdict(true, 5), verdict(true, 9)]).unwrap();
        assert!(split.iter().all(|v| v.allowed));
        assert_eq!(split[1].remaining, 9);
        assert!(
            merged.split(&[verdict(true, 5)]).is_none(),
            "a verdict short"
        );
    }
}
