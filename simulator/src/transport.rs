//! Sends callouts to the clusters they name, as Envoy's async HTTP client would.
//!
//! Failures arrive as Envoy delivers them: a timeout as a 504 (`upstream request timeout`), a
//! refused or broken connection before the answer's headers as a 503, a cluster with no host
//! as a 503 (`no healthy upstream`), and a reset after the headers or a body over 32 MiB as an
//! answer without headers.
//!
//! Replays are deterministic: a callout that touches a limit key another callout still in
//! flight touches waits for it, so Redis sees the checks of one key in the order the filter
//! made them, however the connections race. Callouts on other keys run side by side.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use sluice_core::wire::REPLAY_TIME_HEADER;
use tokio::task::JoinHandle;

use crate::connect::{Endpoint, HttpClient};
use crate::key_order::KeyOrder;
use sluice_host::header_map::HeaderMap;
use sluice_host::state::{CalloutReply, OutgoingCallout};

/// A callout's answer and how long it took.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// What the module will be given.
    pub reply: CalloutReply,
    /// Wall time from sending to answer.
    pub latency: Duration,
}

/// An HTTP client for callouts.
pub struct Transport {
    client: HttpClient,
    /// Each cluster's endpoint, and the authority requests to it carry.
    clusters: HashMap<String, (Endpoint, String)>,
    /// In a virtual-time replay, which times callouts out itself: only a service that never
    /// answers is cut off here.
    virtual_time: bool,
}

/// Envoy's answer to a callout that outlived its timeout.
pub(crate) fn upstream_timeout() -> CalloutReply {
    envoy_reply(504, "upstream request timeout")
}

fn envoy_reply(status: u16, body: &str) -> CalloutReply {
    CalloutReply {
        headers: Some(HeaderMap::from_pairs([
            (":status".to_owned(), status.to_string().into_bytes()),
            (
                "content-length".to_owned(),
                body.len().to_string().into_bytes(),
            ),
            ("content-type".to_owned(), b"text/plain".to_vec()),
        ])),
        body: Some(body.as_bytes().to_vec()),
        trailers: HeaderMap::default(),
    }
}

/// Envoy's async client fails a callout whose answer's body grows past this
/// (`kBufferLimitForResponse`, 32 MiB, in `source/common/http/async_client_impl.h`).
pub const RESPONSE_BUFFER_LIMIT: usize = 32 * 1024 * 1024;

/// In virtual time, the least wall time after which a callout without an answer is taken as
/// never answered.
const NEVER_ANSWERS_AFTER: Duration = Duration::from_secs(1);

/// Envoy's answer when a connection fails before the answer's headers (Envoy 1.40's words for
/// a refused connection).
const CONNECT_FAILURE: &str = "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure";

impl Transport {
    /// A transport to these clusters.
    pub fn new(clusters: HashMap<String, Endpoint>) -> Transport {
        let clusters: HashMap<String, (Endpoint, String)> = clusters
            .into_iter()
            .map(|(name, endpoint)| {
                let authority = endpoint.authority(&name);
                (name, (endpoint, authority))
            })
            .collect();
        let client = HttpClient::new(
            clusters
                .values()
                .map(|(e, a)| (a.clone(), e.clone()))
                .collect(),
        );
        Transport {
            client,
            clusters,
            virtual_time: false,
        }
    }

    /// Leaves callout timeouts to a replay in virtual time, which must not depend on how fast
    /// the machine answers: a service gets ten times a callout's timeout of wall time (at
    /// least a second) before it is taken as never answering.
    pub fn in_virtual_time(mut self) -> Transport {
        self.virtual_time = true;
        self
    }

    /// Sends one callout; `replay_time_us` is stamped on it for a server in replay mode.
    pub async fn send(&self, callout: OutgoingCallout, replay_time_us: Option<i64>) -> Delivered {
        let started = crate::replay::clock::wall_now();
        let reply = self.exchange(callout, replay_time_us).await;
        Delivered {
            reply,
            latency: started.elapsed(),
        }
    }

    async fn exchange(
        &self,
        callout: OutgoingCallout,
        replay_time_us: Option<i64>,
    ) -> CalloutReply {
        let (endpoint, authority) = match self.clusters.get(&callout.cluster) {
            Some((Endpoint::NoHost, _)) | None => return envoy_reply(503, "no healthy upstream"),
            Some((endpoint, authority)) => (endpoint, authority),
        };
        let header = |name: &str| {
            callout
                .headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let path = String::from_utf8_lossy(&header(":path")).into_owned();
        let mut request = http::Request::builder()
            .method(header(":method").as_slice())
            .uri(format!("http://{authority}{path}"))
            .header(http::header::HOST, header(":authority"));
        for (name, value) in callout.headers.iter().filter(|(k, _)| !k.starts_with(':')) {
            request = request.header(name.as_str(), value.as_slice());
        }
        if let Some(t) = replay_time_us {
            request = request.header(REPLAY_TIME_HEADER, t.to_string());
        }
        let Ok(request) = request.body(Bytes::from(callout.body)) else {
            return envoy_reply(503, CONNECT_FAILURE);
        };
        let exchange = async {
            let Ok(response) = self.client.send(endpoint, request).await else {
                return envoy_reply(503, CONNECT_FAILURE);
            };
            let (parts, body) = response.into_parts();
            let mut headers = vec![(
                ":status".to_owned(),
                parts.status.as_u16().to_string().into_bytes(),
            )];
            headers.extend(
                parts
                    .headers
                    .iter()
                    .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec())),
            );
            match Limited::new(body, RESPONSE_BUFFER_LIMIT).collect().await {
                Ok(body) => CalloutReply {
                    headers: Some(HeaderMap::from_pairs(headers)),
                    body: Some(body.to_bytes().to_vec()),
                    trailers: HeaderMap::default(),
                },
                // Reset after the headers, or an answer over the buffer limit: Envoy delivers
                // no headers at all.
                Err(_) => CalloutReply {
                    headers: None,
                    body: None,
                    trailers: HeaderMap::default(),
                },
            }
        };
        if callout.timeout_ms == 0 {
            return exchange.await;
        }
        let mut timeout = Duration::from_millis(u64::from(callout.timeout_ms));
        if self.virtual_time {
            timeout = (timeout * 10).max(NEVER_ANSWERS_AFTER);
        }
        match tokio::time::timeout(timeout, exchange).await {
            Ok(reply) => reply,
            Err(_) => upstream_timeout(),
        }
    }
}

/// The keys a callout touches, read from its body without validating the rest (the server
/// does that).
#[derive(serde::Deserialize)]
struct CheckKeys<'a> {
    #[serde(borrow)]
    checks: Vec<CheckKey<'a>>,
}

#[derive(serde::Deserialize, Hash)]
struct CheckKey<'a> {
    rule: &'a str,
    key: &'a str,
}

impl CheckKey<'_> {
    /// Which callouts must wait for each other: two checks of one limit key always hash the
    /// same, and two keys that happen to collide only make a callout wait when it need not.
    fn ordering_hash(&self) -> u64 {
        let mut hasher = std::hash::DefaultHasher::new();
        self.hash(&mut hasher);
        hasher.finish()
    }
}

/// Sends callouts concurrently, but those that share a limit key in the order they were made.
pub struct Dispatcher {
    transport: Arc<Transport>,
    runtime: tokio::runtime::Handle,
    order: KeyOrder,
}

impl Dispatcher {
    /// A dispatcher spawning on `runtime`.
    pub fn new(transport: Arc<Transport>, runtime: tokio::runtime::Handle) -> Dispatcher {
        Dispatcher {
            transport,
            runtime,
            order: KeyOrder::default(),
        }
    }

    /// Starts sending `callout` once the earlier callouts on its keys are answered.
    pub fn dispatch(
        &mut self,
        callout: OutgoingCallout,
        replay_time_us: Option<i64>,
    ) -> JoinHandle<Delivered> {
        // A body that cannot be read might touch any key.
        let keys: Option<Vec<u64>> = serde_json::from_slice::<CheckKeys<'_>>(&callout.body)
            .ok()
            .map(|r| r.checks.iter().map(CheckKey::ordering_hash).collect());
        let (waits, done_tx) = self.order.enter(keys.as_deref());
        let transport = Arc::clone(&self.transport);
        self.runtime.spawn(async move {
            for wait in waits {
                let _ = wait.await;
            }
            let delivered = transport.send(callout, replay_time_us).await;
            let _ = done_tx.send(());
            delivered
        })
    }
}
