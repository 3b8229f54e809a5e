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
use sluice_core::decision::Denial;
use sluice_core::policy::{HttpRequest, PlannedCheck, Policy, Rule};
use sluice_core::verdict::Verdict;
use sluice_core::wire::{DECIDE_PATH, read_decide_response, write_decide_request};

use crate::answer;
use crate::callout;
use crate::configured::{Configured, now_us};
use crate::ffi;
use crate::lease::Reservation;

mod verdicts;

/// The rule a planned check comes from. Planned checks come from this policy's
/// `checks_for`, so the index is always in range.
fn rule<'a>(shared: &'a Configured, planned: &PlannedCheck) -> &'a Rule {
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
    shared: Option<Rc<Configured>>,
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
    pub fn new(id: u32, shared: Option<Rc<Configured>>) -> Stream {
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
        shared: &Configured,
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
    fn act_on_headers(&mut self, act: Act, shared: &Configured) -> Action {
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
    fn act_on_answer(&mut self, act: Act, shared: &Configured) {
        match act {
            Act::Continue => {
                ffi::resume_request();
            }
            Act::Hold { delay_ms } => self.hold(shared, delay_ms),
            Act::Reply(denial) => self.reply(&denial),
        }
    }

    fn hold(&mut self, shared: &Configured, delay_ms: u64) {
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
            self.record_cache_hit(&shared, hit);
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
