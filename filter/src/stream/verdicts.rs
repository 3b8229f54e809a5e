//! Deciding a request from its verdicts: those of its leases, the deny cache's, the server's,
//! or the failure mode's; counting and recording what came of each rule.

use sluice_core::decision::{Decision, Denial, RuleVerdict, decide};
use sluice_core::deny_cache::{Entry, EntryId, entry_id};
use sluice_core::key::{LimitKey, RuleName};
use sluice_core::policy::{FailureMode, Rule};
use sluice_core::record::{self, DECISION_PROPERTY, RuleOutcome, RuleRecord};
use sluice_core::verdict::Verdict;

use super::{Act, Stream, rule};
use crate::configured::{Configured, now_us};
use crate::ffi;
use crate::lease::Local;
use crate::warnings::Warning;

/// The deny-cache entry for the server's denial `verdict` of `rule`'s `key`, answered to a
/// callout sent at `asked_at_ms`; none when it says when to retry.
///
/// No longer than the limit's own longest wait: an answer claiming more (a lagging clock, or
/// garbage) would otherwise lock the key out here with no callout to correct it; an entry cut
/// short only costs a callout.
fn cache_entry(rule: &Rule, key: &LimitKey, verdict: &Verdict, asked_at_ms: u64) -> Option<Entry> {
    let retry_ms = verdict.retry_after_ms?;
    let longest_ms = rule.limit.longest_wait_ms();
    Some(Entry {
        id: entry_id(&rule.name, key),
        until_ms: asked_at_ms.saturating_add(retry_ms.min(longest_ms)),
        reset_at_ms: asked_at_ms.saturating_add(verdict.reset_ms.min(longest_ms)),
        limit: verdict.limit,
    })
}

impl Stream {
    /// Counts what came of each planned check and records it for access logs, in the filter
    /// state `wasm.sluice.decision`: `outcomes` gives, check by check, its outcome, the delay it
    /// was held for and whether it was decided here.
    fn record(
        &self,
        shared: &Configured,
        outcomes: impl IntoIterator<Item = (RuleOutcome, u64, bool)>,
    ) {
        let records: Vec<RuleRecord<&RuleName, &str>> = self
            .planned
            .iter()
            .zip(outcomes)
            .map(|(p, (outcome, delay_ms, local))| {
                shared.stats.outcome(p.rule, outcome, delay_ms > 0, local);
                RuleRecord {
                    rule: &rule(shared, p).name,
                    key: p.key.as_str(),
                    outcome,
                    delay_ms,
                    local,
                }
            })
            .collect();
        ffi::set_filter_state(DECISION_PROPERTY, &record::encode(&records));
    }

    /// Records a request answered from the deny cache: check `hit` found a cached denial, the
    /// others were skipped.
    pub(super) fn record_cache_hit(&self, shared: &Configured, hit: usize) {
        self.record(
            shared,
            (0..self.planned.len()).map(|i| {
                let outcome = if i == hit {
                    RuleOutcome::CachedDeny
                } else {
                    RuleOutcome::Skipped
                };
                (outcome, 0, false)
            }),
        );
    }

    /// A live cached denial for any enforced check not decided here, as a local reply. A
    /// check decided from a lease needs none: the server admitted the units it holds, and
    /// a lookup is a host call.
    pub(super) fn cached_denial(&self, shared: &Configured, now: u64) -> Option<(usize, Denial)> {
        if !shared.cache.enabled() {
            return None;
        }
        self.planned
            .iter()
            .zip(&self.local)
            .enumerate()
            .filter(|(_, (p, local))| local.is_none() && !rule(shared, p).shadow)
            .map(|(i, (p, _))| (i, p))
            .find_map(|(i, p)| {
                let rule = rule(shared, p);
                let entry = shared.cache.lookup(EntryId::new(&rule.name, &p.key), now)?;
                let verdict = Verdict {
                    allowed: false,
                    limit: entry.limit,
                    remaining: 0,
                    reset_ms: entry.reset_at_ms.saturating_sub(now),
                    retry_after_ms: Some(entry.until_ms - now),
                    delay_ms: 0,
                };
                let rule_verdict = RuleVerdict {
                    rule: rule.name.as_str(),
                    limit: &rule.limit,
                    shadow: false,
                    verdict: &verdict,
                };
                match decide(&shared.policy.response, &[rule_verdict]) {
                    Decision::Deny(denial) => Some((i, denial)),
                    Decision::Allow { .. } => None,
                }
            })
    }

    /// Decides the leased checks that their allowances can decide: taken units admit, an
    /// allowance the server said is empty denies.
    pub(super) fn decide_from_leases(&mut self, shared: &Configured, now_us: u64) {
        let rules = &shared.policy.rules;
        self.local = self
            .planned
            .iter()
            .map(|p| {
                let rule = rules.get(p.rule)?;
                let config = rule.lease.as_ref()?;
                match shared.leases.take(p.rule, rule, config, &p.key, now_us) {
                    Local::Taken {
                        reservation,
                        limit,
                        remaining,
                    } => {
                        self.reservations.push(reservation);
                        Some(Verdict {
                            allowed: true,
                            limit,
                            remaining,
                            reset_ms: 0,
                            retry_after_ms: Some(0),
                            delay_ms: 0,
                        })
                    }
                    Local::Denied {
                        retry_after_ms,
                        limit,
                    } => Some(Verdict {
                        allowed: false,
                        limit,
                        remaining: 0,
                        reset_ms: retry_after_ms,
                        retry_after_ms: Some(retry_after_ms),
                        delay_ms: 0,
                    }),
                    Local::NotHeld => None,
                }
            })
            .collect();
    }

    /// Whether a check decided here denies the request (an enforced one denied).
    pub(super) fn denied_here(&self, shared: &Configured) -> bool {
        self.planned
            .iter()
            .zip(&self.local)
            .any(|(p, v)| !rule(shared, p).shadow && v.is_some_and(|v| !v.allowed))
    }

    /// Every check's verdict: those decided here, then the server's for the others, in
    /// order; `None` for a check no one decided (the request was denied before it was asked).
    pub(super) fn all_verdicts(&self, remote: &[Verdict]) -> Vec<Option<Verdict>> {
        let mut remote = remote.iter();
        self.local
            .iter()
            .map(|local| local.or_else(|| remote.next().copied()))
            .collect()
    }

    /// Decides from the verdicts and remembers what came of each rule.
    pub(super) fn conclude(&mut self, shared: &Configured, verdicts: &[Option<Verdict>]) -> Act {
        let asked_at = self.asked_at_ms;
        let rule_verdicts: Vec<RuleVerdict<'_>> = self
            .planned
            .iter()
            .zip(verdicts)
            .filter_map(|(p, v)| {
                let rule = rule(shared, p);
                Some(RuleVerdict {
                    rule: rule.name.as_str(),
                    limit: &rule.limit,
                    shadow: rule.shadow,
                    verdict: v.as_ref()?,
                })
            })
            .collect();
        let decision = decide(&shared.policy.response, &rule_verdicts);
        let denied =
            record::request_denied(rule_verdicts.iter().map(|v| (v.shadow, v.verdict.allowed)));
        let outcomes = self.planned.iter().zip(verdicts).zip(&self.local).map(
            |((planned, verdict), local)| {
                let rule = rule(shared, planned);
                let local = local.is_some();
                let outcome = verdict.map_or(RuleOutcome::Skipped, |v| {
                    record::outcome(rule.shadow, v.allowed, denied)
                });
                let delay_ms = match verdict {
                    Some(v) if outcome == RuleOutcome::Allowed => v.delay_ms,
                    _ => 0,
                };
                if outcome == RuleOutcome::Denied
                    && !local
                    && let Some(entry) =
                        verdict.and_then(|v| cache_entry(rule, &planned.key, &v, asked_at))
                {
                    // Judged at the callout's time, not at a fresh clock read (a host call)
                    // on an answer: against it, the cache keeps another key's entry only if
                    // that outlasts this one, which then outlasts the answer too.
                    shared.cache.remember(&entry, asked_at);
                }
                (outcome, delay_ms, local)
            },
        );
        self.record(shared, outcomes);
        match decision {
            Decision::Deny(denial) => {
                self.give_back(shared);
                Act::Reply(denial)
            }
            Decision::Allow { delay_ms, headers } => {
                self.response_headers = headers;
                if delay_ms > 0 {
                    Act::Hold { delay_ms }
                } else {
                    Act::Continue
                }
            }
        }
    }

    /// The request is denied: the units it took from allowances go back.
    pub(super) fn give_back(&mut self, shared: &Configured) {
        if self.reservations.is_empty() {
            return;
        }
        let now = now_us(self);
        for reservation in self.reservations.drain(..) {
            shared.leases.give_back(&reservation, now);
        }
    }

    /// The service gave no usable answer: count it, record it, apply the failure mode to the
    /// checks it was asked (those decided here stand).
    pub(super) fn fail(&mut self, shared: &Configured, reason: &str) -> Act {
        shared.warnings.warn(Warning::Callout, now_us(self), || {
            format!("sluice: {reason}; failure mode applies")
        });
        shared.stats.callout_failure();
        let admit = shared.policy.failure_mode == FailureMode::Allow;
        let outcomes = self.local.iter().map(|local| match local {
            Some(_) if admit => (RuleOutcome::Allowed, 0, true),
            Some(_) => (RuleOutcome::Skipped, 0, true),
            None => (RuleOutcome::Failed, 0, false),
        });
        self.record(shared, outcomes);
        if admit {
            Act::Continue
        } else {
            self.give_back(shared);
            Act::Reply(shared.policy.failure_denial())
        }
    }
}
