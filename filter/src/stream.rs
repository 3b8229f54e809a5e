//! One request: its checks, the deny cache, leases, at most one callout, and what comes of it.
//!
//! Headers in, [`Policy::checks_for`] decides which rules apply; a live denial in the deny
//! cache answers at once. Leased rules are decided from their allowances where they hold units
//! ([`crate::lease`]); every other check goes in one callout, the request pauses, and the answer
//! (or its absence) decides: resume, hold (shaping), or reply locally. A request denied by any
//! rule gives back the units it took from allowances: a denied request consumes nothing.

use std::borrow::Cow;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use sluice_core::decision::{Decision, Denial, RuleVerdict, decide};
use sluice_core::deny_cache::{Entry, EntryId, entry_id};
use sluice_core::key::RuleName;
use sluice_core::policy::{FailureMode, HttpRequest, PlannedCheck, Policy, Rule};
use sluice_core::record::{self, DECISION_PROPERTY, RuleOutcome, RuleRecord};
use sluice_core::verdict::Verdict;
use sluice_core::wire::{DECIDE_PATH, read_decide_response, write_decide_request};

use crate::answer;
use crate::callout;
use crate::ffi;
use crate::lease::{Local, Reservation};
use crate::root::{Shared, now_us};
use crate::warnings::Warning;

/// The rule a planned check comes from. Planned checks come from this policy's
/// `checks_for`, so the index is always in range.
fn rule<'a>(shared: &'a Shared, planned: &PlannedCheck) -> &'a Rule {
    &shared.policy.rules[planned.rule]
}

/// What to do with the request once decided.
enum Act {
    Continue,
    Hold { delay_ms: u64 },
    Reply(Denial),
}

/// The stream context of one request.
pub struct Stream {
    id: u32,
    shared: Option<Rc<Shared>>,
    planned: Vec<PlannedCheck>,
    /// Per planned check, its verdict when decided here from a lease.
    local: Vec<Option<Verdict>>,
    /// Units taken from allowances, given back if the request is denied.
    reservations: Vec<Reservation>,
    /// How many checks the callout carries (those not decided here), once it is sent.
    asked: Option<usize>,
    /// When the callout left: the server decides at this time or a little later, so
    /// waits it reports count from here and a cached denial never outlives the real one.
    asked_at_ms: u64,
    response_headers: Vec<(String, String)>,
    replied_locally: bool,
    /// When a shaping leaky bucket holds the request until, once it does.
    held_until_ms: Option<u64>,
}

impl Stream {
    /// The context for stream `id`; `shared` is `None` only when configuration failed.
    pub fn new(id: u32, shared: Option<Rc<Shared>>) -> Stream {
        Stream {
            id,
            shared,
            planned: Vec::new(),
            local: Vec::new(),
            reservations: Vec::new(),
            asked: None,
            asked_at_ms: 0,
            response_headers: Vec::new(),
            replied_locally: false,
            held_until_ms: None,
        }
    }

    /// The parts of the request the policy reads: only the headers its rules name, when it
    /// can say which (a header map read whole costs an allocation per header).
    fn read_request<'p>(&self, policy: &'p Policy) -> HttpRequest<'p> {
        let source_address = policy
            .reads_source_address
            .then(|| ffi::get_property(ffi::SOURCE_ADDRESS))
            .flatten()
            .map(|bytes| {
                String::from_utf8(bytes)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
            });
        let headers = match &policy.headers_read {
            Some(names) => names
                .iter()
                .filter_map(|name| {
                    let value = self.get_http_request_header_bytes(name)?;
                    Some((Cow::Borrowed(name.as_str()), value))
                })
                .collect(),
            None => self
                .get_http_request_headers_bytes()
                .into_iter()
                .map(|(name, value)| (Cow::Owned(name), value))
                .collect(),
        };
        HttpRequest {
            headers,
            source_address,
        }
    }

    /// A live cached denial for any enforced check not decided here, as a local reply. A
    /// check decided from a lease needs none: the server admitted the units it holds, and
    /// a lookup is a host call.
    fn cached_denial(&self, shared: &Shared, now: u64) -> Option<(usize, Denial)> {
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
    fn decide_from_leases(&mut self, shared: &Shared, now_us: u64) {
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
    fn denied_here(&self, shared: &Shared) -> bool {
        self.planned
            .iter()
            .zip(&self.local)
            .any(|(p, v)| !rule(shared, p).shadow && v.is_some_and(|v| !v.allowed))
    }

    fn send_callout(&mut self, policy: &Policy) -> Result<(), String> {
        let remote: Vec<&PlannedCheck> = self
            .planned
            .iter()
            .zip(&self.local)
            .filter(|(_, local)| local.is_none())
            .map(|(p, _)| p)
            .collect();
        let mut body = Vec::with_capacity(128 * remote.len() + 16);
        write_decide_request(
            &mut body,
            remote
                .iter()
                .map(|p| (&policy.rules[p.rule].template, &p.key)),
        );
        callout::post(self, &policy.service, DECIDE_PATH, &body)?;
        self.asked = Some(remote.len());
        Ok(())
    }

    /// The verdicts in the callout's answer, or why there are none: an answer that is not
    /// one verdict per check asked, each possible for its rule's limit, is refused whole.
    fn read_answer(
        &self,
        shared: &Shared,
        num_headers: usize,
        body_size: usize,
    ) -> Result<Vec<Verdict>, String> {
        let asked = self.asked.ok_or("an answer to no callout")?;
        answer::read(self, num_headers, body_size, |body| {
            let remote = read_decide_response(body, asked).map_err(|e| e.to_string())?;
            let asked_limits = self
                .planned
                .iter()
                .zip(&self.local)
                .filter(|(_, local)| local.is_none())
                .map(|(p, _)| &rule(shared, p).limit);
            for (i, (verdict, limit)) in remote.iter().zip(asked_limits).enumerate() {
                verdict
                    .check_against(limit)
                    .map_err(|e| format!("response body: results[{i}].{e}"))?;
            }
            Ok(remote)
        })
    }

    /// Every check's verdict: those decided here, then the server's for the others, in
    /// order; `None` for a check no one decided (the request was denied before it was asked).
    fn all_verdicts(&self, remote: &[Verdict]) -> Vec<Option<Verdict>> {
        let mut remote = remote.iter();
        self.local
            .iter()
            .map(|local| local.or_else(|| remote.next().copied()))
            .collect()
    }

    /// Decides from the verdicts and remembers what came of each rule.
    fn conclude(&mut self, shared: &Shared, verdicts: &[Option<Verdict>]) -> Act {
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
        let mut records = Vec::with_capacity(self.planned.len());
        for ((planned, verdict), local) in self.planned.iter().zip(verdicts).zip(&self.local) {
            let rule = rule(shared, planned);
            let local = local.is_some();
            let outcome = verdict.map_or(RuleOutcome::Skipped, |v| {
                record::outcome(rule.shadow, v.allowed, denied)
            });
            let delay_ms = match verdict {
                Some(v) if outcome == RuleOutcome::Allowed => v.delay_ms,
                _ => 0,
            };
            shared
                .stats
                .outcome(planned.rule, outcome, delay_ms > 0, local);
            if outcome == RuleOutcome::Denied
                && !local
                && let Some(Verdict {
                    retry_after_ms: Some(retry_ms),
                    reset_ms,
                    limit,
                    ..
                }) = verdict
            {
                // No longer than the limit's own longest wait: an answer claiming more (a
                // lagging clock, or garbage) would otherwise lock the key out here with no
                // callout to correct it; an entry cut short only costs a callout.
                let longest_ms = rule.limit.longest_wait_ms();
                let entry = Entry {
                    id: entry_id(&rule.name, &planned.key),
                    until_ms: asked_at.saturating_add((*retry_ms).min(longest_ms)),
                    reset_at_ms: asked_at.saturating_add((*reset_ms).min(longest_ms)),
                    limit: *limit,
                };
                // Judged at the callout's time, not at a fresh clock read (a host call) on
                // an answer: against it, the cache keeps another key's entry only if that
                // outlasts this one, which then outlasts the answer too.
                shared.cache.remember(&entry, asked_at);
            }
            records.push(RuleRecord {
                rule: &rule.name,
                key: planned.key.as_str(),
                outcome,
                delay_ms,
                local,
            });
        }
        ffi::set_filter_state(DECISION_PROPERTY, &record::encode(&records));
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
    fn give_back(&mut self, shared: &Shared) {
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
    fn fail(&mut self, shared: &Shared, reason: &str) -> Act {
        shared.warnings.warn(Warning::Callout, now_us(self), || {
            format!("sluice: {reason}; failure mode applies")
        });
        shared.stats.callout_failure();
        let admit = shared.policy.failure_mode == FailureMode::Allow;
        let records: Vec<RuleRecord<&RuleName, &str>> = self
            .planned
            .iter()
            .zip(&self.local)
            .map(|(p, local)| {
                let (outcome, local) = match local {
                    Some(_) if admit => (RuleOutcome::Allowed, true),
                    Some(_) => (RuleOutcome::Skipped, true),
                    None => (RuleOutcome::Failed, false),
                };
                shared.stats.outcome(p.rule, outcome, false, local);
                RuleRecord {
                    rule: &rule(shared, p).name,
                    key: p.key.as_str(),
                    outcome,
                    delay_ms: 0,
                    local,
                }
            })
            .collect();
        ffi::set_filter_state(DECISION_PROPERTY, &record::encode(&records));
        if admit {
            Act::Continue
        } else {
            self.give_back(shared);
            Act::Reply(shared.policy.failure_denial())
        }
    }

    fn reply(&mut self, denial: &Denial) {
        let headers: Vec<(&str, &str)> = denial
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        self.replied_locally = true;
        self.send_http_response(
            u32::from(denial.status),
            headers,
            Some(denial.body.as_bytes()),
        );
    }

    /// Carries out `act` from the request-headers callback.
    fn act_on_headers(&mut self, act: Act, shared: &Shared) -> Action {
        match act {
            Act::Continue => Action::Continue,
            Act::Hold { delay_ms } => {
                self.hold(shared, delay_ms);
                Action::Pause
            }
            Act::Reply(denial) => {
                self.reply(&denial);
                Action::Pause
            }
        }
    }

    /// Carries out `act` after the callout's answer (the request is paused).
    fn act_on_answer(&mut self, act: Act, shared: &Shared) {
        match act {
            Act::Continue => {
                ffi::resume_request();
            }
            Act::Hold { delay_ms } => self.hold(shared, delay_ms),
            Act::Reply(denial) => self.reply(&denial),
        }
    }

    fn hold(&mut self, shared: &Shared, delay_ms: u64) {
        let release_at = self.asked_at_ms.saturating_add(delay_ms);
        self.held_until_ms = Some(release_at);
        shared.held.borrow_mut().hold(self.id, release_at);
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Some(release_at) = self.held_until_ms
            && let Some(shared) = &self.shared
        {
            shared.held.borrow_mut().forget(self.id, release_at);
        }
    }
}

impl Context for Stream {
    fn on_http_call_response(
        &mut self,
        _token: u32,
        num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        let Some(shared) = self.shared.clone() else {
            return;
        };
        let act = match self.read_answer(&shared, num_headers, body_size) {
            Ok(remote) => {
                let verdicts = self.all_verdicts(&remote);
                self.conclude(&shared, &verdicts)
            }
            Err(reason) => self.fail(&shared, &reason),
        };
        self.act_on_answer(act, &shared);
    }
}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        let request = self.read_request(&shared.policy);
        let plan = shared.policy.plan(&request);
        if plan.client_ip_fell_back {
            shared.stats.client_ip_fallback();
        }
        self.planned = plan.checks;
        if self.planned.is_empty() {
            return Action::Continue;
        }
        // One clock read for the whole callback: each is a host call.
        let now_us = now_us(self);
        let now = now_us / 1000;
        self.asked_at_ms = now;
        self.decide_from_leases(&shared, now_us);
        if let Some((hit, denial)) = self.cached_denial(&shared, now) {
            self.give_back(&shared);
            let records: Vec<RuleRecord<&RuleName, &str>> = self
                .planned
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let outcome = if i == hit {
                        RuleOutcome::CachedDeny
                    } else {
                        RuleOutcome::Skipped
                    };
                    shared.stats.outcome(p.rule, outcome, false, false);
                    RuleRecord {
                        rule: &rule(&shared, p).name,
                        key: p.key.as_str(),
                        outcome,
                        delay_ms: 0,
                        local: false,
                    }
                })
                .collect();
            ffi::set_filter_state(DECISION_PROPERTY, &record::encode(&records));
            return self.act_on_headers(Act::Reply(denial), &shared);
        }
        let all_here = self.local.iter().all(Option::is_some);
        if all_here || self.denied_here(&shared) {
            let verdicts = self.local.clone();
            let act = self.conclude(&shared, &verdicts);
            return self.act_on_headers(act, &shared);
        }
        match self.send_callout(&shared.policy) {
            Ok(()) => {
                let remote = self.planned.iter().zip(&self.local);
                shared
                    .stats
                    .callout(remote.filter(|(_, l)| l.is_none()).map(|(p, _)| p.rule));
                Action::Pause
            }
            Err(reason) => {
                let act = self.fail(&shared, &reason);
                self.act_on_headers(act, &shared)
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        // A local reply already carries its headers; it passes through here too.
        if !self.replied_locally {
            for (name, value) in std::mem::take(&mut self.response_headers) {
                self.add_http_response_header(&name, &value);
            }
        }
        Action::Continue
    }
}
