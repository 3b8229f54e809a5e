//! Where a cluster's host is, and how a request reaches it: over TCP, or handed to the
//! in-process server as a value (no socket, no HTTP/1 codec; the same router and handlers).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_server::in_process::InProcessServer;
use tokio::net::TcpStream;

/// A cluster's single host.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// `host:port` over TCP.
    Tcp(String),
    /// The server running in this process.
    InProcess(InProcessServer),
    /// A cluster with no healthy host.
    NoHost,
}

impl Endpoint {
    /// An endpoint from a base URL, `http://host:port`.
    pub fn from_url(url: &str) -> Endpoint {
        let authority = url.trim_start_matches("http://").trim_end_matches('/');
        Endpoint::Tcp(authority.to_owned())
    }

    /// The authority requests to it carry (unique per endpoint).
    pub(crate) fn authority(&self, cluster: &str) -> String {
        match self {
            Endpoint::Tcp(authority) => authority.clone(),
            Endpoint::InProcess(_) | Endpoint::NoHost => format!("{cluster}.in-process"),
        }
    }
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The cluster has no host to send to.
    #[error("no healthy upstream")]
    NoHost,
    /// Connecting, sending or reading the answer's head failed.
    #[error(transparent)]
    Http(#[from] hyper_util::client::legacy::Error),
}

/// Sends requests to endpoints: over pooled keep-alive connections for TCP, or by calling the
/// in-process server.
#[derive(Clone)]
pub struct HttpClient {
    pool: Client<Connector, Full<Bytes>>,
}

impl HttpClient {
    /// A client for these endpoints, each known by its authority.
    pub fn new(by_authority: HashMap<String, Endpoint>) -> HttpClient {
        let pool = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(64)
            .pool_idle_timeout(std::time::Duration::from_secs(30))
            .build(Connector {
                by_authority: Arc::new(by_authority),
            });
        HttpClient { pool }
    }

    /// Sends `request` (its URI naming `endpoint`'s authority) and answers with the response,
    /// whose body may still be arriving.
    pub async fn send(
        &self,
        endpoint: &Endpoint,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Body>, SendError> {
        match endpoint {
            Endpoint::InProcess(server) => Ok(server.call(request.map(Body::from)).await),
            Endpoint::Tcp(_) => {
                let response = self.pool.request(request.map(Full::new)).await?;
                Ok(response.map(Body::new))
            }
            Endpoint::NoHost => Err(SendError::NoHost),
        }
    }
}

/// Opens TCP connections for the pool, by the authority it was given.
#[derive(Clone)]
struct Connector {
    by_authority: Arc<HashMap<String, Endpoint>>,
}

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<TcpStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<TcpStream>>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let endpoint = uri
            .authority()
            .and_then(|a| self.by_authority.get(a.as_str()))
            .cloned();
        Box::pin(async move {
            match endpoint {
                Some(Endpoint::Tcp(authority)) => {
                    let stream = TcpStream::connect(authority).await?;
                    stream.set_nodelay(true)?;
                    Ok(TokioIo::new(stream))
                }
                Some(Endpoint::InProcess(_) | Endpoint::NoHost) | None => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "no healthy upstream",
                )),
            }
        })
    }
}
