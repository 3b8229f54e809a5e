//! One request in Envoy's native filter chain: [`sluice_filter_logic::Request`] decides it;
//! this reads the request in place, sends the callout, pauses and resumes, and replies.

#![allow(unsafe_code)]

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;

use sluice_core::decision::Denial;
use sluice_core::policy::{FailureMode, HttpRequest, Policy};
use sluice_core::verdict::Verdict;
use sluice_core::wire::DECIDE_PATH;
use sluice_filter_logic::answer::refused;
use sluice_filter_logic::{Act, Repeats, Request, Start, callout_headers, read_request_into};

use sluice_filter_logic::lease::Reservation;

use crate::config::{Configured, StreamGlue};
use crate::envoy::Filter;
use crate::hold;

thread_local! {
    /// This worker's decisions for its requests to repeat (see [`Repeats`]).
    static REPEATS: RefCell<Repeats> = RefCell::new(Repeats::default());
}

/// Envoy's response code details for a sluice reply, in access logs' `%RESPONSE_CODE_DETAILS%`.
const DETAILS: &str = "sluice_rate_limited";

/// One stream's filter.
pub struct Stream {
    configured: Arc<Configured>,
    request: Request<Reservation>,
    replied_locally: bool,
    /// The decision's callout, while it is out.
    callout: Option<u64>,
    /// The verdicts of the callout's answer, kept for the next stream's.
    remote: Vec<Verdict>,
}

/// What the request-headers hook answers Envoy.
pub enum Headers {
    Continue,
    Stop,
}

/// What comes of a stream's hook, for the hook to carry out in Envoy once it no longer
/// borrows the stream ([`carry_out`]): letting a paused request go on and replying each run
/// the filter chain on, and Envoy may call this filter's hooks again from within (a local
/// reply's response headers; an upstream that fails at once), which borrow the stream
/// themselves.
#[must_use]
pub enum Then {
    /// The request goes on.
    GoOn,
    /// The request waits on the module (a callout, a hold), or nothing changed.
    Wait,
    /// Reply locally. (Boxed: a `Then` passes through every hook, in two registers.)
    Reply(Box<Denial>),
}

/// Carries out `then` for a request, `paused` when it waits on the module: what the
/// request-headers hook answers.
// Inlined: in the request-headers hook, going on is then only its answer.
#[inline(always)]
pub fn carry_out(filter: Filter, then: Then, paused: bool) -> Headers {
    match then {
        Then::GoOn => {
            if paused {
                filter.continue_request();
            }
            Headers::Continue
        }
        Then::Wait => Headers::Stop,
        Then::Reply(denial) => {
            filter.send_response(denial.status, &denial.headers, &denial.body, DETAILS);
            Headers::Stop
        }
    }
}

impl Stream {
    pub fn new(configured: Arc<Configured>) -> Stream {
        Stream {
            configured,
            request: Request::default(),
            replied_locally: false,
            callout: None,
            remote: Vec::new(),
        }
    }

    /// This finished stream, readied for a new one of `configured`: its request's lists and
    /// buffers are kept (see [`crate::spares`]).
    pub fn reuse(&mut self, configured: &Arc<Configured>) {
        // Nearly always the configuration it served last: kept without touching its count.
        if !Arc::ptr_eq(&self.configured, configured) {
            self.configured = Arc::clone(configured);
        }
        self.replied_locally = false;
        self.callout = None;
    }

    /// Whether the configuration this stream last served is one Envoy has let go of.
    pub fn serves_retired(&self) -> bool {
        self.configured.is_retired()
    }

    /// Decides the request by the failure mode alone (after a panic, when its state cannot be
    /// trusted).
    pub fn decide_by_failure_mode(&mut self, filter: Filter) -> Then {
        StreamGlue {
            configured: &self.configured,
            filter,
        }
        .count_panic();
        let policy = &self.configured.policy;
        if policy.failure_mode == FailureMode::Allow {
            return Then::GoOn;
        }
        let denial = policy.failure_denial();
        self.reply(denial)
    }

    /// A local reply with `denial`, which the response-headers hook, run by the reply inline,
    /// knows for one.
    fn reply(&mut self, denial: Denial) -> Then {
        self.replied_locally = true;
        Then::Reply(Box::new(denial))
    }

    pub fn on_request_headers(&mut self, filter: Filter) -> Then {
        let policy = &self.configured.policy;
        let glue = StreamGlue {
            configured: &self.configured,
            filter,
        };
        // Ends with its block, not moved into `drop`: a move copies its 232 bytes.
        let start = {
            let mut http_request = HttpRequest::default();
            // SAFETY: the request read ends with this block, within this hook, and nothing
            // changes the request's headers meanwhile.
            unsafe { read(filter, policy, &mut http_request) };
            let (id, request) = (self.configured.id, &mut self.request);
            // Without them while another stream's start is on this worker's stack (never:
            // nothing in a start calls back into the module's hooks) or the worker is ending.
            let repeated = REPEATS.try_with(|repeats| {
                let mut repeats = repeats.try_borrow_mut().ok()?;
                Some(request.start_repeating(&glue, &http_request, repeats.of(id)))
            });
            match repeated {
                Ok(Some(start)) => start,
                _ => request.start(&glue, &http_request),
            }
        };
        let act = match start {
            Start::Decided(act) => act,
            Start::Callout => {
                let service = &policy.service;
                match filter.post(
                    &service.cluster,
                    callout_headers(service, DECIDE_PATH),
                    self.request.callout_body(),
                    service.timeout.as_millis(),
                ) {
                    Ok(id) => {
                        self.callout = Some(id);
                        self.request.sent(&glue);
                        return Then::Wait;
                    }
                    Err(refused) => self.request.fail(
                        &glue,
                        &format!(
                            "the callout to cluster `{}` was not sent: {refused}",
                            service.cluster
                        ),
                    ),
                }
            }
        };
        self.act(filter, act)
    }

    /// The callout's answer: `status` and `body`, or `None` for a callout that failed.
    pub fn on_callout_done(
        &mut self,
        filter: Filter,
        id: u64,
        answer: Option<(&[u8], &[u8])>,
    ) -> Then {
        if self.callout != Some(id) {
            return Then::Wait;
        }
        self.callout = None;
        let glue = StreamGlue {
            configured: &self.configured,
            filter,
        };
        let read = match answer {
            None => Err("the callout was reset".to_owned()),
            Some((status, body)) => self
                .request
                .read_answer_into(&glue, body, &mut self.remote)
                .map_err(|reason| refused(status, body, reason)),
        };
        let act = match read {
            Ok(()) => self.request.answered(&glue, &self.remote),
            Err(reason) => self.request.fail(&glue, &reason),
        };
        self.act(filter, act)
    }

    /// What comes of `act`: a hold is made here; going on and replying are the hook's.
    fn act(&mut self, filter: Filter, act: Act) -> Then {
        match act {
            Act::Continue => Then::GoOn,
            Act::Reply(denial) => self.reply(denial),
            Act::Hold { delay_ms } => {
                let release_at = self.request.asked_at_ms().saturating_add(delay_ms);
                if filter
                    .scheduler()
                    .is_some_and(|scheduler| hold::hold(scheduler, release_at))
                {
                    return Then::Wait;
                }
                let glue = StreamGlue {
                    configured: &self.configured,
                    filter,
                };
                let act = self
                    .request
                    .fail(&glue, "no timer to hold a shaped request");
                self.act(filter, act)
            }
        }
    }

    pub fn on_response_headers(&mut self, filter: Filter) {
        // A local reply already carries its headers; it passes through here too.
        if !self.replied_locally {
            for (name, value) in self.request.response_headers() {
                filter.add_response_header(name, value);
            }
        }
    }
}

/// The parts of the request the policy reads, read in place, into `request`.
///
/// # Safety
/// The request's header values are Envoy's: `request` must be dropped before the hook that
/// made `filter` returns, and before anything changes the request's headers.
unsafe fn read<'p>(filter: Filter, policy: &'p Policy, request: &mut HttpRequest<'p>) {
    read_request_into(
        policy,
        // SAFETY: the caller's promise.
        |name| unsafe { filter.request_header(name) }.map(Cow::Borrowed),
        || filter.request_headers(),
        || filter.source_address(),
        request,
    );
}
