//! One request: its checks, the deny cache, leases, at most one callout, and what comes of it.
//!
//! [`Request::start`] finds the rules that apply; a live denial in the deny cache answers at
//! once. Leased rules are decided from their allowances where they hold units; every other
//! check goes in one callout, whose answer (or its absence) decides: continue, hold (shaping),
//! or reply. A request denied by any rule gives back the units it took from allowances: a
//! denied request consumes nothing.

use sluice_core::decision::{Decision, Denial, RuleVerdict, decide};
use sluice_core::deny_cache::{Entry, EntryId, entry_id};
use sluice_core::key::LimitKey;
use sluice_core::policy::{FailureMode, HttpRequest, PlannedCheck, Rule};
use sluice_core::record::{self, RecordWriter, RuleOutcome};
use sluice_core::verdict::Verdict;
use sluice_core::wire::{read_decide_response_into, write_decide_request};

use crate::glue::{Glue, Local};

mod repeats;
#[cfg(test)]
mod tests;

pub use repeats::{Repeating, Repeats};

/// What to do with the request once decided.
#[derive(Debug)]
pub enum Act {
    /// Let it through.
    Continue,
    /// Hold it for `delay_ms` from [`Request::asked_at_ms`], then let it through (shaping).
    Hold {
        /// How long.
        delay_ms: u64,
    },
    /// Reply locally.
    Reply(Denial),
}

/// Where [`Request::conclude`] finds the checks' verdicts.
#[derive(Clone, Copy)]
enum Verdicts {
    /// Those decided here alone (the others, undecided, skipped).
    Local,
    /// Those decided here and the server's, merged in `verdicts`.
    All,
}

/// How a request starts.
#[derive(Debug)]
pub enum Start {
    /// Decided without the server.
    Decided(Act),
    /// Send [`Request::callout_body`] to sluice-server's decide path, then [`Request::sent`]
    /// or [`Request::fail`].
    Callout,
}

/// One request's checks and what has been decided of them.
///
/// Its lists and buffers outlive the request: a host that keeps a `Request` for the next one
/// ([`Request::start`] readies it) decides a request without allocating once they have grown.
/// A host that keeps a worker's [`Repeats`] decides a request that repeats a kept one's leased
/// checks and verdicts as that one was ([`Request::start_repeating`]).
pub struct Request<R> {
    planned: Vec<PlannedCheck>,
    /// Per planned check, its verdict when decided here from a lease.
    local: Vec<Option<Verdict>>,
    /// Units taken from allowances, each with the planned check it was taken for; given back
    /// if the request is denied.
    reservations: Vec<(usize, R)>,
    /// How many checks the callout carries (those not decided here), once it is sent.
    asked: Option<usize>,
    /// When the request started: the server decides at this time or a little later, so
    /// waits it reports count from here and a cached denial never outlives the real one.
    asked_at_ms: u64,
    response_headers: Vec<(String, String)>,
    /// The callout's body.
    body: Vec<u8>,
    /// Per planned check, its verdict, from here or the server, once the server answered.
    verdicts: Vec<Option<Verdict>>,
    /// The encoded record of what came of each check.
    record: Vec<u8>,
}

impl<R> Default for Request<R> {
    fn default() -> Request<R> {
        Request {
            planned: Vec::new(),
            local: Vec::new(),
            reservations: Vec::new(),
            asked: None,
            asked_at_ms: 0,
            response_headers: Vec::new(),
            body: Vec::new(),
            verdicts: Vec::new(),
            record: Vec::new(),
        }
    }
}

/// The rule a planned check comes from. Planned checks come from this policy's `plan`, so the
/// index is always in range.
fn rule<'a, G: Glue>(glue: &'a G, planned: &PlannedCheck) -> &'a Rule {
    &glue.policy().rules[planned.rule]
}

/// Counts what came of each of the `planned` checks and records it for access logs, encoded
/// in `buffer`: `outcomes` gives, check by check, its outcome, the delay it was held for and
/// whether it was decided here.
fn record<G: Glue>(
    glue: &G,
    planned: &[PlannedCheck],
    outcomes: impl IntoIterator<Item = (RuleOutcome, u64, bool)>,
    buffer: &mut Vec<u8>,
) {
    let mut record = RecordWriter::new(buffer);
    for (p, (outcome, delay_ms, local)) in planned.iter().zip(outcomes) {
        glue.count_outcome(p.rule, outcome, delay_ms > 0, local);
        record.line(
            &rule(glue, p).name,
            p.key.as_str(),
            outcome,
            delay_ms,
            local,
        );
    }
    glue.record(record.finish());
}

/// The deny-cache entry for the server's denial `verdict` of `rule`'s `key`, answered to a
/// callout sent at `asked_at_ms`: no longer than the limit's own longest wait (an entry cut
/// short only costs a callout).
fn cache_entry(rule: &Rule, key: &LimitKey, verdict: &Verdict, asked_at_ms: u64) -> Option<Entry> {
    Entry::of_denial(
        entry_id(&rule.name, key),
        verdict,
        asked_at_ms,
        rule.limit.longest_wait_ms(),
    )
}

impl<R> Request<R> {
    /// Plans `request`'s checks and decides what can be decided here: with no checks, or
    /// from a cached denial, or from leases alone, the request is decided; else the callout
    /// to send.
    ///
    /// Whatever the request held before is forgotten: a host may start request after request
    /// in one `Request`.
    pub fn start<G: Glue<Reservation = R>>(&mut self, glue: &G, request: &HttpRequest) -> Start {
        self.start_with(glue, request, None)
    }

    /// [`Request::start`], deciding a request admitted at once from allowances alone as the
    /// decision `repeating` kept for the same checks and verdicts was, if it kept one, and
    /// keeping its decision there if not (see [`Repeats`]).
    pub fn start_repeating<G: Glue<Reservation = R>>(
        &mut self,
        glue: &G,
        request: &HttpRequest,
        repeating: Repeating<'_>,
    ) -> Start {
        self.start_with(glue, request, Some(repeating))
    }

    fn start_with<G: Glue<Reservation = R>>(
        &mut self,
        glue: &G,
        request: &HttpRequest,
        mut repeating: Option<Repeating<'_>>,
    ) -> Start {
        let policy = glue.policy();
        self.asked = None;
        self.reservations.clear();
        if policy.plan_into(request, &mut self.planned) {
            glue.count_client_ip_fallback();
        }
        if self.planned.is_empty() {
            self.local.clear();
            self.response_headers.clear();
            return Start::Decided(Act::Continue);
        }
        // One clock read for the whole request start: each is a host call.
        let now_us = glue.now_us();
        let now = now_us / 1000;
        self.asked_at_ms = now;
        self.decide_from_leases(glue, now_us);
        if let Some(repeating) = &mut repeating
            && let Some(kept) = repeating.find(&self.planned, &self.local)
        {
            self.repeat(glue, kept);
            return Start::Decided(Act::Continue);
        }
        self.response_headers.clear();
        if let Some((hit, denial)) = self.cached_denial(glue, now) {
            self.give_back(glue);
            self.record_cache_hit(glue, hit);
            return Start::Decided(Act::Reply(denial));
        }
        let all_local = self.local.iter().all(Option::is_some);
        if all_local || self.denied_here(glue) {
            let act = self.conclude(glue, Verdicts::Local);
            if all_local
                && matches!(act, Act::Continue)
                && let Some(repeating) = &mut repeating
            {
                repeating.keep(
                    &mut self.planned,
                    &mut self.local,
                    &mut self.record,
                    &self.response_headers,
                );
            }
            return Start::Decided(act);
        }
        let remote = self
            .planned
            .iter()
            .zip(&self.local)
            .filter(|(_, local)| local.is_none())
            .map(|(p, _)| (&policy.rules[p.rule].template, &p.key));
        self.body.clear();
        write_decide_request(&mut self.body, remote);
        Start::Callout
    }

    /// The conclusion `kept`, for a request with the same checks and verdicts (see
    /// [`Repeats`]): each check decided from its allowance (a shadow one may have denied),
    /// the request admitted undelayed, and the record and headers it left stand.
    fn repeat<G: Glue<Reservation = R>>(&mut self, glue: &G, kept: &repeats::Decided) {
        for (p, v) in self.planned.iter().zip(&self.local) {
            let allowed = v.is_some_and(|v| v.allowed);
            let outcome = record::outcome(rule(glue, p).shadow, allowed, false);
            glue.count_outcome(p.rule, outcome, false, true);
        }
        glue.record(&kept.record);
        repeats::copy_headers(&mut self.response_headers, &kept.headers);
    }

    /// The body of the callout [`Request::start`] asked for.
    pub fn callout_body(&self) -> &[u8] {
        &self.body
    }

    /// The callout [`Request::start`] asked for is on its way.
    pub fn sent<G: Glue<Reservation = R>>(&mut self, glue: &G) {
        self.asked = Some(self.local.iter().filter(|l| l.is_none()).count());
        let remote = self.planned.iter().zip(&self.local);
        glue.count_callout(remote.filter(|(_, l)| l.is_none()).map(|(p, _)| p.rule));
    }

    /// When the request started, in milliseconds since the epoch: a hold counts from here.
    pub fn asked_at_ms(&self) -> u64 {
        self.asked_at_ms
    }

    /// The rate-limit headers an admitted request's response carries.
    pub fn response_headers(&self) -> &[(String, String)] {
        &self.response_headers
    }

    /// The verdicts in the callout's answer `body`, or why there are none: an answer that is
    /// not one verdict per check asked, each possible for its rule's limit, is refused whole.
    pub fn read_answer<G: Glue<Reservation = R>>(
        &self,
        glue: &G,
        body: &[u8],
    ) -> Result<Vec<Verdict>, String> {
        let mut remote = Vec::new();
        self.read_answer_into(glue, body, &mut remote)?;
        Ok(remote)
    }

    /// [`Request::read_answer`] into `remote`, in place of what it held: a host that keeps
    /// one list for every answer reads them without allocating.
    pub fn read_answer_into<G: Glue<Reservation = R>>(
        &self,
        glue: &G,
        body: &[u8],
        remote: &mut Vec<Verdict>,
    ) -> Result<(), String> {
        let asked = self.asked.ok_or("an answer to no callout")?;
        read_decide_response_into(body, asked, remote).map_err(|e| e.to_string())?;
        let asked_limits = self
            .planned
            .iter()
            .zip(&self.local)
            .filter(|(_, local)| local.is_none())
            .map(|(p, _)| &rule(glue, p).limit);
        for (i, (verdict, limit)) in remote.iter().zip(asked_limits).enumerate() {
            verdict
                .check_against(limit)
                .map_err(|e| format!("response body: results[{i}].{e}"))?;
        }
        Ok(())
    }

    /// Decides from the server's verdicts `remote` (from [`Request::read_answer`]) and those
    /// decided here.
    pub fn answered<G: Glue<Reservation = R>>(&mut self, glue: &G, remote: &[Verdict]) -> Act {
        let mut remote = remote.iter();
        self.verdicts.clear();
        self.verdicts.extend(
            self.local
                .iter()
                .map(|local| local.or_else(|| remote.next().copied())),
        );
        self.conclude(glue, Verdicts::All)
    }

    /// The service gave no usable answer: count it, record it, apply the failure mode to the
    /// checks it was asked (those decided here stand).
    pub fn fail<G: Glue<Reservation = R>>(&mut self, glue: &G, reason: &str) -> Act {
        glue.callout_failed(glue.now_us(), reason);
        let admit = glue.policy().failure_mode == FailureMode::Allow;
        let outcomes = self.local.iter().map(|local| match local {
            Some(_) if admit => (RuleOutcome::Allowed, 0, true),
            Some(_) => (RuleOutcome::Skipped, 0, true),
            None => (RuleOutcome::Failed, 0, false),
        });
        record(glue, &self.planned, outcomes, &mut self.record);
        if admit {
            Act::Continue
        } else {
            self.give_back(glue);
            Act::Reply(glue.policy().failure_denial())
        }
    }

    /// Records a request answered from the deny cache: check `hit` found a cached denial, the
    /// others were skipped.
    fn record_cache_hit<G: Glue<Reservation = R>>(&mut self, glue: &G, hit: usize) {
        let checks = self.planned.len();
        record(
            glue,
            &self.planned,
            (0..checks).map(|i| {
                let outcome = if i == hit {
                    RuleOutcome::CachedDeny
                } else {
                    RuleOutcome::Skipped
                };
                (outcome, 0, false)
            }),
            &mut self.record,
        );
    }

    /// A live cached denial for any enforced check not decided here, as a local reply. A
    /// check decided from a lease needs none: the server admitted the units it holds, and
    /// a lookup may be a host call.
    fn cached_denial<G: Glue<Reservation = R>>(
        &self,
        glue: &G,
        now: u64,
    ) -> Option<(usize, Denial)> {
        if !glue.cache_enabled() {
            return None;
        }
        self.planned
            .iter()
            .zip(&self.local)
            .enumerate()
            .filter(|(_, (p, local))| local.is_none() && !rule(glue, p).shadow)
            .find_map(|(i, (p, _))| {
                let rule = rule(glue, p);
                let entry = glue.cache_lookup(EntryId::new(&rule.name, &p.key), now)?;
                let verdict = entry.denial_at(now);
                let rule_verdict = RuleVerdict {
                    rule: rule.name.as_str(),
                    limit: &rule.limit,
                    shadow: false,
                    verdict: &verdict,
                };
                match decide(&glue.policy().response, [rule_verdict]) {
                    Decision::Deny(denial) => Some((i, denial)),
                    Decision::Allow { .. } => None,
                }
            })
    }

    /// Decides the leased checks that their allowances can decide: taken units admit, an
    /// allowance the server said is empty denies.
    fn decide_from_leases<G: Glue<Reservation = R>>(&mut self, glue: &G, now_us: u64) {
        let rules = &glue.policy().rules;
        let reservations = &mut self.reservations;
        self.local.clear();
        self.local
            .extend(self.planned.iter().enumerate().map(|(check, p)| {
                let rule = rules.get(p.rule)?;
                let config = rule.lease.as_ref()?;
                match glue.take_lease(p.rule, rule, config, &p.key, now_us) {
                    Local::Taken {
                        reservation,
                        limit,
                        remaining,
                    } => {
                        reservations.push((check, reservation));
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
            }));
    }

    /// Whether a check decided here denies the request (an enforced one denied).
    fn denied_here<G: Glue<Reservation = R>>(&self, glue: &G) -> bool {
        self.planned
            .iter()
            .zip(&self.local)
            .any(|(p, v)| !rule(glue, p).shadow && v.is_some_and(|v| !v.allowed))
    }

    /// Decides from the checks' verdicts and remembers what came of each rule (those decided
    /// here are in `local`).
    fn conclude<G: Glue<Reservation = R>>(&mut self, glue: &G, from: Verdicts) -> Act {
        let asked_at = self.asked_at_ms;
        // Lent, not copied: a copy was an allocation for every request a new `Request` decides.
        let verdicts = match from {
            Verdicts::Local => &self.local,
            Verdicts::All => &self.verdicts,
        };
        let rule_verdicts = self.planned.iter().zip(verdicts).filter_map(|(p, v)| {
            let rule = rule(glue, p);
            Some(RuleVerdict {
                rule: rule.name.as_str(),
                limit: &rule.limit,
                shadow: rule.shadow,
                verdict: v.as_ref()?,
            })
        });
        let decision = decide(&glue.policy().response, rule_verdicts);
        // Denied exactly when an enforced check denied it (`record::request_denied`).
        let denied = matches!(decision, Decision::Deny(_));
        let outcomes = self.planned.iter().zip(verdicts).zip(&self.local).map(
            |((planned, verdict), local)| {
                let rule = rule(glue, planned);
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
                    // Judged at the request's start, not at a fresh clock read (a host call)
                    // on an answer: against it, the cache keeps another key's entry only if
                    // that outlasts this one, which then outlasts the answer too.
                    glue.cache_remember(&entry, asked_at);
                }
                (outcome, delay_ms, local)
            },
        );
        record(glue, &self.planned, outcomes, &mut self.record);
        match decision {
            Decision::Deny(denial) => {
                self.give_back(glue);
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
    fn give_back<G: Glue<Reservation = R>>(&mut self, glue: &G) {
        if self.reservations.is_empty() {
            return;
        }
        let now = glue.now_us();
        for (check, reservation) in self.reservations.drain(..) {
            if let Some(planned) = self.planned.get(check) {
                glue.give_back(&reservation, planned.rule, &planned.key, now);
            }
        }
    }
}
