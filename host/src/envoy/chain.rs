//! The filter chain around the module: what its callbacks ask for applied, callouts sent,
//! requests forwarded upstream or answered locally, and streams completed.

use std::net::IpAddr;

use super::{Completed, Envoy, Output, Phase, Request};
use crate::Effects;
use crate::header_map::HeaderMap;
use crate::state::{LocalReply, MapAccess, OutgoingCallout, StreamAction, StreamHost};
use crate::stream_properties::StreamProperties;

impl Envoy {
    pub(super) fn after_root_callback(
        &mut self,
        worker: usize,
        effects: Effects,
        out: &mut Vec<Output>,
    ) {
        self.emit_callouts_and_tick(worker, effects.callouts, out);
        let contexts: Vec<u32> = self.workers[worker].streams.keys().copied().collect();
        for context in contexts {
            let actions = self.workers[worker].vm.take_actions(context);
            if !actions.is_empty() {
                self.apply_actions(worker, context, actions, out);
            }
        }
    }

    pub(super) fn emit_callouts_and_tick(
        &mut self,
        worker: usize,
        callouts: Vec<OutgoingCallout>,
        out: &mut Vec<Output>,
    ) {
        out.extend(
            callouts
                .into_iter()
                .map(|callout| Output::Callout { worker, callout }),
        );
        let w = &mut self.workers[worker];
        let period = w.vm.tick_period_ms();
        if period != w.tick_period_ms {
            w.tick_period_ms = period;
            out.push(Output::TickPeriod {
                worker,
                period_ms: period,
            });
        }
    }

    /// Emits the callouts of a stream callback and applies its actions; true if the request
    /// was continued.
    pub(super) fn apply(
        &mut self,
        worker: usize,
        context: u32,
        effects: Effects,
        out: &mut Vec<Output>,
    ) -> bool {
        self.emit_callouts_and_tick(worker, effects.callouts, out);
        let continues = effects.actions.contains(&StreamAction::ContinueRequest);
        let others: Vec<StreamAction> = effects
            .actions
            .into_iter()
            .filter(|a| *a != StreamAction::ContinueRequest)
            .collect();
        self.apply_actions(worker, context, others, out);
        continues
            && self.workers[worker]
                .streams
                .get(&context)
                .is_some_and(|s| s.local_reply.is_none() && s.phase == Phase::RequestPaused)
    }

    pub(super) fn apply_actions(
        &mut self,
        worker: usize,
        context: u32,
        actions: Vec<StreamAction>,
        out: &mut Vec<Output>,
    ) {
        for action in actions {
            let Some(stream) = self.workers[worker].streams.get_mut(&context) else {
                return;
            };
            match action {
                StreamAction::LocalReply(reply) => {
                    if stream.local_reply.is_some() {
                        stream.phase = Phase::Hung;
                        continue;
                    }
                    stream.local_reply = Some(reply.clone());
                    self.local_reply(worker, context, reply, out);
                }
                StreamAction::ContinueRequest
                    if stream.phase == Phase::RequestPaused && stream.local_reply.is_none() =>
                {
                    self.forward_upstream(worker, context, out);
                }
                StreamAction::ContinueResponse if stream.phase == Phase::ResponsePaused => {
                    self.complete(worker, context, out);
                }
                StreamAction::Reset => {
                    // Envoy's Context::closeStream records these response code details.
                    let reply = LocalReply {
                        status: 0,
                        details: "wasm_close_stream".into(),
                        body: Vec::new(),
                        headers: Vec::new(),
                    };
                    self.finish_without_filter(worker, context, reply, out);
                }
                _ => {}
            }
        }
    }

    pub(super) fn settle(&mut self, worker: usize, context: u32, out: &mut Vec<Output>) {
        if self.workers[worker].streams.contains_key(&context) {
            out.push(Output::Paused { worker, context });
        }
    }

    /// The request goes on to the upstream, which answers at once with the recorded status.
    pub(super) fn forward_upstream(&mut self, worker: usize, context: u32, out: &mut Vec<Output>) {
        let w = &mut self.workers[worker];
        let Some(stream) = w.streams.get(&context) else {
            return;
        };
        let (status, bytes, bypass) = (
            stream.request.upstream_status,
            stream.request.upstream_bytes,
            stream.bypass,
        );
        let response = HeaderMap::from_pairs([
            (":status".to_owned(), status.to_string().into_bytes()),
            ("content-length".to_owned(), bytes.to_string().into_bytes()),
            ("content-type".to_owned(), b"text/html".to_vec()),
            ("x-envoy-upstream-service-time".to_owned(), b"0".to_vec()),
        ]);
        if bypass {
            self.finish_response(worker, context, response, out);
            return;
        }
        if let Some(host) = w.vm.state_mut().streams.get_mut(&context) {
            host.request_access = MapAccess::Unavailable;
            host.response_headers = response;
            host.response_access = MapAccess::Writable;
            host.properties.response_code = Some(status);
        }
        match w.vm.on_response_headers(context, true) {
            Ok((action, effects)) => {
                let _ = self.apply(worker, context, effects, out);
                if action == crate::abi::Action::Pause
                    && self.workers[worker]
                        .streams
                        .get(&context)
                        .is_some_and(|s| s.local_reply.is_none())
                {
                    if let Some(s) = self.workers[worker].streams.get_mut(&context) {
                        s.phase = Phase::ResponsePaused;
                    }
                    self.settle(worker, context, out);
                } else if self.workers[worker]
                    .streams
                    .get(&context)
                    .is_some_and(|s| s.local_reply.is_none())
                {
                    self.complete(worker, context, out);
                }
            }
            Err(_) => self.vm_failed(worker, context, true, out),
        }
    }

    /// A local reply: its headers pass through this filter's response callbacks, then the
    /// stream ends.
    pub(super) fn local_reply(
        &mut self,
        worker: usize,
        context: u32,
        reply: LocalReply,
        out: &mut Vec<Output>,
    ) {
        let mut pairs = vec![(":status".to_owned(), reply.status.to_string().into_bytes())];
        pairs.extend(reply.headers.iter().cloned());
        pairs.push((
            "content-length".to_owned(),
            reply.body.len().to_string().into_bytes(),
        ));
        if !reply.body.is_empty() {
            pairs.push(("content-type".to_owned(), b"text/plain".to_vec()));
        }
        let w = &mut self.workers[worker];
        if let Some(host) = w.vm.state_mut().streams.get_mut(&context) {
            host.request_access = MapAccess::Unavailable;
            host.response_headers = HeaderMap::from_pairs(pairs);
            host.response_access = MapAccess::Writable;
            host.properties.response_code = Some(reply.status as u16);
        }
        let result =
            w.vm.on_response_headers(context, reply.body.is_empty())
                .and_then(|(_, effects)| {
                    if reply.body.is_empty() {
                        return Ok(effects);
                    }
                    if let Some(host) = w.vm.state_mut().streams.get_mut(&context) {
                        host.response_body = reply.body.clone();
                    }
                    w.vm.on_response_body(context, reply.body.len(), true)
                        .map(|(_, more)| Effects {
                            actions: effects.actions.into_iter().chain(more.actions).collect(),
                            callouts: effects.callouts.into_iter().chain(more.callouts).collect(),
                        })
                });
        match result {
            Ok(effects) => {
                self.emit_callouts_and_tick(worker, effects.callouts, out);
                // A second local reply from the response path takes the first one's place:
                // its status goes to the client, and the response callbacks do not run again.
                // (Envoy 1.40; older Envoys hung the stream, envoy#28826.)
                let second = effects.actions.into_iter().rev().find_map(|a| match a {
                    StreamAction::LocalReply(reply) => Some(reply),
                    _ => None,
                });
                if let Some(second) = second {
                    self.replace_local_reply(worker, context, second);
                }
                self.complete(worker, context, out);
            }
            Err(_) => self.vm_failed(worker, context, true, out),
        }
    }

    /// `reply` answers the stream instead of the local reply on its way out.
    pub(super) fn replace_local_reply(&mut self, worker: usize, context: u32, reply: LocalReply) {
        let w = &mut self.workers[worker];
        if let Some(host) = w.vm.state_mut().streams.get_mut(&context) {
            let mut pairs = vec![(":status".to_owned(), reply.status.to_string().into_bytes())];
            pairs.extend(reply.headers.iter().cloned());
            host.response_headers = HeaderMap::from_pairs(pairs);
            host.properties.response_code = Some(reply.status as u16);
        }
        if let Some(stream) = w.streams.get_mut(&context) {
            stream.local_reply = Some(reply);
        }
    }

    /// The response is sent: access-log phase, then `on_log`, `on_done`, `on_delete`.
    pub(super) fn complete(&mut self, worker: usize, context: u32, out: &mut Vec<Output>) {
        let w = &mut self.workers[worker];
        if let Some(host) = w.vm.state_mut().streams.get_mut(&context) {
            host.request_access = MapAccess::ReadOnly;
            host.response_access = MapAccess::ReadOnly;
        }
        let ended = w.vm.end_stream(context);
        let Some(stream) = w.streams.remove(&context) else {
            return;
        };
        let (headers, filter_state) = match ended {
            Ok(Some(host)) => (
                host.response_headers.into_pairs(),
                host.filter_state.into_iter().collect(),
            ),
            _ => (Vec::new(), Vec::new()),
        };
        let status = headers
            .iter()
            .find(|(k, _)| k == ":status")
            .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse().ok())
            .unwrap_or(0);
        out.push(Output::Completed(Completed {
            id: stream.request.id,
            worker,
            status,
            headers,
            local_reply: stream.local_reply.map(|r| r.details),
            filter_state,
            started_ns: stream.started_ns,
            ended_ns: self.now_ns,
        }));
    }

    pub(super) fn finish_response(
        &mut self,
        worker: usize,
        context: u32,
        response: HeaderMap,
        out: &mut Vec<Output>,
    ) {
        let Some(stream) = self.workers[worker].streams.remove(&context) else {
            return;
        };
        let status = response
            .get(":status")
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
            .unwrap_or(0);
        out.push(Output::Completed(Completed {
            id: stream.request.id,
            worker,
            status,
            headers: response.into_pairs(),
            local_reply: stream.local_reply.map(|r| r.details),
            filter_state: Vec::new(),
            started_ns: stream.started_ns,
            ended_ns: self.now_ns,
        }));
    }

    /// Ends a stream with a reply that does not pass through the module (its VM failed, or
    /// Envoy itself answers).
    pub(super) fn finish_without_filter(
        &mut self,
        worker: usize,
        context: u32,
        reply: LocalReply,
        out: &mut Vec<Output>,
    ) {
        let w = &mut self.workers[worker];
        let on_current_vm = w
            .streams
            .get(&context)
            .is_some_and(|s| s.vm_generation == w.generation);
        if w.vm.failure().is_none() && on_current_vm {
            let _ = w.vm.end_stream(context);
        }
        if let Some(stream) = w.streams.get_mut(&context) {
            stream.local_reply = Some(reply.clone());
        }
        let response =
            HeaderMap::from_pairs([(":status".to_owned(), reply.status.to_string().into_bytes())]);
        self.finish_response(worker, context, response, out);
    }
}

impl Request {
    /// The host side of its stream: Envoy's request headers and properties.
    pub(super) fn stream_host(&self, now_ns: u64, context: u32) -> StreamHost {
        let mut headers = HeaderMap::from_pairs(
            self.headers
                .iter()
                .map(|(k, v)| (k.as_bytes(), v.as_slice())),
        );
        // Envoy generates an x-request-id only when the request has none; made here from `id`.
        let request_id = match headers.get("x-request-id") {
            Some(id) => String::from_utf8_lossy(id).into_owned(),
            None => {
                let id = format!("{:08x}-0000-4000-8000-{:012x}", self.id as u32, self.id);
                headers.add(b"x-request-id", id.as_bytes());
                id
            }
        };
        if headers.get("x-forwarded-proto").is_none() {
            let scheme = headers.get(":scheme").unwrap_or(b"http").to_vec();
            headers.add(b"x-forwarded-proto", scheme);
        }
        StreamHost {
            request_headers: headers,
            request_access: MapAccess::Writable,
            response_headers: HeaderMap::default(),
            response_access: MapAccess::Unavailable,
            response_body: Vec::new(),
            properties: StreamProperties {
                source_ip: self.peer.0,
                source_port: self.peer.1,
                destination_ip: IpAddr::from([10, 0, 0, 1]),
                destination_port: 10000,
                request_time_ns: now_ns as i64,
                request_id,
                protocol: "HTTP/1.1".to_owned(),
                route_name: "default".to_owned(),
                cluster_name: "upstream".to_owned(),
                connection_id: u64::from(context),
                response_code: None,
            },
            filter_state: Default::default(),
            actions: Vec::new(),
        }
    }
}
