//! Listeners with TLS or without, and the connections they accept.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::ListenerTls;
use crate::log_throttle::LogThrottle;
use crate::metrics::Metrics;

/// How long a client may take over its handshake before its connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often, at most, a failed handshake is logged: a scanner, or a client with the wrong
/// certificate, fails one a connection.
const HANDSHAKE_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// A listener, with TLS or without.
pub(crate) enum Listening {
    Cleartext(TcpListener),
    Tls {
        listener: tls_listener::TlsListener<TcpListener, TlsAcceptor>,
        /// Counts the failed handshakes.
        metrics: Arc<Metrics>,
        failures: LogThrottle,
    },
}

impl Listening {
    /// `listener`, with `tls` on it if given, counting its failed handshakes in `metrics`.
    pub(crate) fn new(
        listener: TcpListener,
        tls: Option<&ListenerTls>,
        metrics: &Arc<Metrics>,
    ) -> Listening {
        match tls {
            None => Listening::Cleartext(listener),
            Some(tls) => Listening::Tls {
                listener: tls_listener::builder(tls.acceptor.clone())
                    .handshake_timeout(HANDSHAKE_TIMEOUT)
                    .listen(listener),
                metrics: Arc::clone(metrics),
                failures: LogThrottle::new(HANDSHAKE_WARNING_INTERVAL),
            },
        }
    }
}

impl axum::serve::Listener for Listening {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Connection, SocketAddr) {
        match self {
            Listening::Cleartext(listener) => {
                let (stream, addr) = axum::serve::Listener::accept(listener).await;
                // Answers are small and latency is the product: no Nagle delay.
                let _ = stream.set_nodelay(true);
                (Connection::Cleartext(stream), addr)
            }
            Listening::Tls {
                listener,
                metrics,
                failures,
            } => loop {
                match listener.accept().await {
                    Ok((stream, addr)) => {
                        let _ = stream.get_ref().0.set_nodelay(true);
                        return (Connection::Tls(Box::new(stream)), addr);
                    }
                    // What the plain listener does with these, as axum has it: a connection
                    // reset before it was taken is nothing; anything else (out of file
                    // descriptors) is worth a pause.
                    Err(tls_listener::Error::ListenerError(e)) => {
                        if !matches!(
                            e.kind(),
                            io::ErrorKind::ConnectionRefused
                                | io::ErrorKind::ConnectionAborted
                                | io::ErrorKind::ConnectionReset
                        ) {
                            tracing::error!(error = %e, "accepting a connection failed");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                    Err(e) => {
                        metrics.tls_handshake_failed();
                        if let Some(left_out) = failures.due(Instant::now()) {
                            let peer = e.peer_addr().map(ToString::to_string);
                            tracing::warn!(error = %e, peer, left_out, "a TLS handshake failed");
                        }
                    }
                }
            },
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Listening::Cleartext(listener) => listener.local_addr(),
            Listening::Tls { listener, .. } => listener.local_addr(),
        }
    }
}

/// An accepted connection, with TLS or without.
pub(crate) enum Connection {
    Cleartext(TcpStream),
    // Boxed: a TLS session's state is some hundreds of bytes beside a socket's few.
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Cleartext(stream) => Pin::new(stream).poll_read(cx, buf),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Connection::Cleartext(stream) => Pin::new(stream).poll_write(cx, buf),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Connection::Cleartext(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Connection::Cleartext(stream) => stream.is_write_vectored(),
            Connection::Tls(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Cleartext(stream) => Pin::new(stream).poll_flush(cx),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Cleartext(stream) => Pin::new(stream).poll_shutdown(cx),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}
