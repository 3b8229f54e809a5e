//! One request in the proxy-wasm host: [`sluice_filter_logic::Request`] decides it; this
//! reads the request, sends the callout, pauses and resumes, holds and replies.

use std::borrow::Cow;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use sluice_core::decision::Denial;
use sluice_core::policy::{HttpRequest, Policy};
use sluice_core::wire::DECIDE_PATH;
use sluice_filter_logic::{Act, Request, Start, read_request};

use crate::answer;
use crate::callout;
use crate::configured::Configured;
use crate::ffi;
use sluice_filter_logic::lease::Reservation;

/// The stream context of one request.
pub struct Stream {
    id: u32,
    shared: Option<Rc<Configured>>,
    request: Request<Reservation>,
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
            request: Request::default(),
            replied_locally: false,
            held_until_ms: None,
        }
    }

    /// The parts of the request the policy reads.
    fn read_request<'p>(&self, policy: &'p Policy) -> HttpRequest<'p> {
        read_request(
            policy,
            |name| self.get_http_request_header_bytes(name).map(Cow::Owned),
            || self.get_http_request_headers_bytes(),
            || {
                ffi::get_property(ffi::SOURCE_ADDRESS).map(|bytes| {
                    String::from_utf8(bytes)
                        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
                })
            },
        )
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
        let release_at = self.request.asked_at_ms().saturating_add(delay_ms);
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
        let request = &self.request;
        let act = match answer::read(self, num_headers, body_size, |body| {
            request.read_answer(shared.as_ref(), body)
        }) {
            Ok(remote) => self.request.answered(shared.as_ref(), &remote),
            Err(reason) => self.request.fail(shared.as_ref(), &reason),
        };
        self.act_on_answer(act, &shared);
    }
}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return Action::Continue;
        };
        let http_request = self.read_request(&shared.policy);
        let act = match self.request.start(shared.as_ref(), &http_request) {
            Start::Decided(act) => act,
            Start::Callout => {
                let body = self.request.callout_body();
                match callout::post(self, &shared.policy.service, DECIDE_PATH, body) {
                    Ok(_) => {
                        self.request.sent(shared.as_ref());
                        return Action::Pause;
                    }
                    Err(reason) => self.request.fail(shared.as_ref(), &reason),
                }
            }
        };
        self.act_on_headers(act, &shared)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        // A local reply already carries its headers; it passes through here too.
        if !self.replied_locally {
            for (name, value) in self.request.response_headers() {
                self.add_http_response_header(name, value);
            }
        }
        Action::Continue
    }
}
