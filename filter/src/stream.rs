//! One request: its checks, the deny cache, one callout, and what comes of it.
//!
//! Headers in, [`Policy::checks_for`] decides which rules apply; a live denial in the deny
//! cache answers at once; otherwise one callout carries every check, the request pauses, and
//! the answer (or its absence) decides: resume, hold (shaping), or reply locally.

use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, LogLevel};
use sluice_core::decision::{Decision, Denial, RuleVerdict, decide};
use sluice_core::deny_cache::{Entry, entry_id};
use sluice_core::policy::{FailureMode, HttpRequest, PlannedCheck, Policy};
use sluice_core::record::{self, DECISION_PROPERTY, RuleOutcome, RuleRecord};
use sluice_core::verdict::Verdict;
use sluice_core::wire::{DECIDE_PATH, DecideRequest};

use crate::ffi;
use crate::root::{Shared, now_ms};

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
    request: Option<DecideRequest>,
    /// When the callout left: the server decides at this time or a little later, so
    /// waits it reports count from here and a cached denial never outlives the real one.
    asked_at_ms: u64,
    response_headers: Vec<(String, String)>,
    replied_locally: bool,
    held: bool,
}

impl Stream {
    /// The context for stream `id`; `shared` is `None` only when configuration failed.
    pub fn new(id: u32, shared: Option<Rc<Shared>>) -> Stream {
        Stream {
            id,
            shared,
            planned: Vec::new(),
            request: None,
            asked_at_ms: 0,
            response_headers: Vec::new(),
            replied_locally: false,
            held: false,
        }
    }

    fn read_request(&self) -> HttpRequest {
        let source_address = hostcalls::get_property(vec!["source", "address"])
            .ok()
            .flatten()
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
        HttpRequest {
            headers: self.get_http_request_headers_bytes(),
            source_address,
        }
    }

    /// A live cached denial for any enforced check, as a local reply.
    fn cached_denial(&self, shared: &Shared, now: u64) -> Option<(usize, Denial)> {
        self.planned
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.check.shadow)
            .find_map(|(i, p)| {
                let entry = shared
                    .cache
                    .lookup(&entry_id(&p.check.rule, &p.check.key), now)?;
                let verdict = Verdict {
                    allowed: false,
                    limit: entry.limit,
                    remaining: 0,
                    reset_ms: entry.reset_at_ms.saturating_sub(now),
                    retry_after_ms: Some(entry.until_ms - now),
                    delay_ms: 0,
                };
                let rule_verdict = RuleVerdict {
                    rule: p.check.rule.as_str(),
                    limit: &p.check.limit,
                    shadow: false,
                    verdict: &verdict,
                };
                match decide(&shared.policy.response, &[rule_verdict]) {
                    Decision::Deny(denial) => Some((i, denial)),
                    Decision::Allow { .. } => None,
                }
            })
    }

    fn send_callout(&mut self, policy: &Policy) -> Result<(), String> {
        let request = DecideRequest {
            checks: self.planned.iter().map(|p| p.check.clone()).collect(),
        };
        let body = serde_json::to_vec(&request).map_err(|e| e.to_string())?;
        let service = &policy.service;
        let bearer = service.token.as_ref().map(|t| format!("Bearer {t}"));
        let mut headers = vec![
            (":method", "POST"),
            (":path", DECIDE_PATH),
            (":authority", service.authority.as_str()),
            ("content-type", "application/json"),
        ];
        if let Some(bearer) = &bearer {
            headers.push(("authorization", bearer.as_str()));
        }
        let timeout = std::time::Duration::from_millis(service.timeout.as_millis());
        self.dispatch_http_call(&service.cluster, headers, Some(&body), vec![], timeout)
            .map_err(|status| {
                format!(
                    "the host refused the callout to cluster `{}`: {status:?}",
                    service.cluster
                )
            })?;
        self.request = Some(request);
        Ok(())
    }

    /// The verdicts in the callout's answer, or why there are none.
    fn read_answer(&self, num_headers: usize, body_size: usize) -> Result<Vec<Verdict>, String> {
        if num_headers == 0 {
            // A reset or an oversized answer: Envoy delivers no headers, and reading them fails.
            return Err("the callout was reset".to_owned());
        }
        let status = self
            .get_http_call_response_header_bytes(":status")
            .unwrap_or_default();
        if status != b"200" {
            let body = self
                .get_http_call_response_body(0, body_size.min(512))
                .unwrap_or_default();
            return Err(format!(
                "sluice-server answered {}: {}",
                String::from_utf8_lossy(&status),
                String::from_utf8_lossy(&body).trim()
            ));
        }
        let body = self
            .get_http_call_response_body(0, body_size)
            .unwrap_or_default();
        let request = self.request.as_ref().ok_or("an answer to no callout")?;
        Ok(request
            .parse_response(&body)
            .map_err(|e| e.to_string())?
            .results)
    }

    /// Decides from the verdicts and remembers what came of each rule.
    fn conclude(&mut self, shared: &Shared, verdicts: &[Verdict]) -> Act {
        let now = now_ms(self);
        let asked_at = self.asked_at_ms;
        let outcomes = record::outcomes(
            self.planned
                .iter()
                .zip(verdicts)
                .map(|(p, v)| (p.check.shadow, v.allowed)),
        );
        let rule_verdicts: Vec<RuleVerdict<'_>> = self
            .planned
            .iter()
            .zip(verdicts)
            .map(|(p, v)| RuleVerdict {
                rule: p.check.rule.as_str(),
                limit: &p.check.limit,
                shadow: p.check.shadow,
                verdict: v,
            })
            .collect();
        let decision = decide(&shared.policy.response, &rule_verdicts);
        let mut records = Vec::with_capacity(self.planned.len());
        for ((planned, verdict), outcome) in self.planned.iter().zip(verdicts).zip(outcomes) {
            let delayed = outcome == RuleOutcome::Allowed && verdict.delay_ms > 0;
            shared.stats.outcome(planned.rule, outcome, delayed);
            if outcome == RuleOutcome::Denied
                && let Some(retry_ms) = verdict.retry_after_ms
            {
                let entry = Entry {
                    id: entry_id(&planned.check.rule, &planned.check.key),
                    until_ms: asked_at + retry_ms,
                    reset_at_ms: asked_at + verdict.reset_ms,
                    limit: verdict.limit,
                };
                shared.cache.remember(&entry, now);
            }
            records.push(RuleRecord {
                rule: planned.check.rule.to_string(),
                key: planned.check.key.to_string(),
                outcome,
                delay_ms: if delayed { verdict.delay_ms } else { 0 },
            });
        }
        ffi::set_filter_state(DECISION_PROPERTY, &record::encode(&records));
        match decision {
            Decision::Deny(denial) => Act::Reply(denial),
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

    /// The service gave no usable answer: count it, record it, apply the failure mode.
    fn fail(&mut self, shared: &Shared, reason: &str) -> Act {
        let _ = hostcalls::log(
            LogLevel::Warn,
            &format!("sluice: {reason}; failure mode applies"),
        );
        shared.stats.callout_failure();
        let records: Vec<RuleRecord> = self
            .planned
            .iter()
            .map(|p| {
                shared.stats.outcome(p.rule, RuleOutcome::Failed, false);
                RuleRecord {
                    rule: p.check.rule.to_string(),
                    key: p.check.key.to_string(),
                    outcome: RuleOutcome::Failed,
                    delay_ms: 0,
                }
            })
            .collect();
        ffi::set_filter_state(DECISION_PROPERTY, &record::encode(&records));
        match shared.policy.failure_mode {
            FailureMode::Allow => Act::Continue,
            FailureMode::Deny => Act::Reply(shared.policy.failure_denial()),
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
        self.held = true;
        let release_at = self.asked_at_ms + delay_ms;
        shared.held.borrow_mut().hold(self.id, release_at);
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.held
            && let Some(shared) = &self.shared
        {
            shared.held.borrow_mut().forget(self.id);
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
        let act = match self.read_answer(num_headers, body_size) {
            Ok(verdicts) => self.conclude(&shared, &verdicts),
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
        let request = self.read_request();
        self.planned = shared.policy.checks_for(&request);
        if self.planned.is_empty() {
            return Action::Continue;
        }
        let now = now_ms(self);
        if let Some((hit, denial)) = self.cached_denial(&shared, now) {
            let records: Vec<RuleRecord> = self
                .planned
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let outcome = if i == hit {
                        RuleOutcome::CachedDeny
                    } else {
                        RuleOutcome::Skipped
                    };
                    shared.stats.outcome(p.rule, outcome, false);
                    RuleRecord {
                        rule: p.check.rule.to_string(),
                        key: p.check.key.to_string(),
                        outcome,
                        delay_ms: 0,
                    }
                })
                .collect();
            ffi::set_filter_state(DECISION_PROPERTY, &record::encode(&records));
            return self.act_on_headers(Act::Reply(denial), &shared);
        }
        self.asked_at_ms = now;
        match self.send_callout(&shared.policy) {
            Ok(()) => {
                shared.stats.callout();
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
