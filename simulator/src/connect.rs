//! Where a cluster's host is, and how to open a connection to it: TCP, or the in-process
//! server's in-memory streams (no socket, the same HTTP).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use sluice_server::memory::MemoryConnector;
use tokio::io::DuplexStream;
use tokio::net::TcpStream;

/// A cluster's single host.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// `host:port` over TCP.
    Tcp(String),
    /// The in-process server, without a socket.
    Memory(MemoryConnector),
    /// A cluster with no healthy host.
    NoHost,
}

impl Endpoint {
    /// An endpoint from a base URL, `http://host:port`.
    pub fn from_url(url: &str) -> Endpoint {
        let authority = url.trim_start_matches("http://").trim_end_matches('/');
        Endpoint::Tcp(authority.to_owned())
    }

    /// The authority the client addresses it by (unique per endpoint).
    pub(crate) fn authority(&self, cluster: &str) -> String {
        match self {
            Endpoint::Tcp(authority) => authority.clone(),
            Endpoint::Memory(_) | Endpoint::NoHost => format!("{cluster}.in-memory"),
        }
    }
}

/// A connection to either kind of endpoint.
pub enum Stream {
    /// TCP.
    Tcp(TokioIo<TcpStream>),
    /// In memory.
    Memory(TokioIo<DuplexStream>),
}

impl Read for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Memory(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl Write for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Memory(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Memory(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Memory(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

/// Opens connections for the HTTP client, by the authority it was given.
#[derive(Clone)]
pub struct Connector {
    by_authority: Arc<HashMap<String, Endpoint>>,
}

impl Connector {
    /// A connector to these endpoints, by authority.
    pub fn new(by_authority: HashMap<String, Endpoint>) -> Connector {
        Connector {
            by_authority: Arc::new(by_authority),
        }
    }
}

impl tower_service::Service<http::Uri> for Connector {
    type Response = Stream;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Stream>> + Send>>;

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
                    Ok(Stream::Tcp(TokioIo::new(stream)))
                }
                Some(Endpoint::Memory(connector)) => {
                    Ok(Stream::Memory(TokioIo::new(connector.connect().await?)))
                }
                Some(Endpoint::NoHost) | None => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "no healthy upstream",
                )),
            }
        })
    }
}
