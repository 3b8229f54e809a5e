//! Listeners with TLS or without, and the connections they accept.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use std::future::Future;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::ListenerTls;
use crate::clock;
use crate::log_throttle::LogThrottle;
use crate::metrics::Metrics;

/// How long a client may take over its handshake before its connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often, at most, a failed handshake is logged: a scanner, or a client with the wrong
/// certificate, fails one a connection.
const HANDSHAKE_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// A listener, with TLS or without, whose connections are bounded in number and time.
pub(crate) struct Listening {
    kind: Kind,
    limits: ConnectionLimits,
}

/// What bounds the connections of every listener of a server.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionLimits {
    /// One permit a connection, shared by the listeners: at the cap, accepting waits.
    permits: Arc<Semaphore>,
    /// How long a connection may pass nothing before it is closed.
    idle: Duration,
    /// How long a client may take from the first byte of a request to the server's first byte
    /// of answer: one that trickles its request a byte at a time is cut off.
    unanswered: Duration,
}

impl ConnectionLimits {
    /// At most `max` connections at once, each closed after `idle` without a byte either way,
    /// or `unanswered` after a client began a request the server has not begun to answer.
    pub(crate) fn new(max: usize, idle: Duration, unanswered: Duration) -> ConnectionLimits {
        ConnectionLimits {
            permits: Arc::new(Semaphore::new(max.max(1))),
            idle,
            unanswered,
        }
    }
}

enum Kind {
    Cleartext(TcpListener),
    Tls {
        listener: tls_listener::TlsListener<TcpListener, TlsAcceptor>,
        /// Counts the failed handshakes.
        metrics: Arc<Metrics>,
        failures: LogThrottle,
    },
}

impl Listening {
    /// `listener`, with `tls` on it if given, counting its failed handshakes in `metrics`,
    /// its connections bounded by `limits`.
    pub(crate) fn new(
        listener: TcpListener,
        tls: Option<&ListenerTls>,
        metrics: &Arc<Metrics>,
        limits: &ConnectionLimits,
    ) -> Listening {
        let kind = match tls {
            None => Kind::Cleartext(listener),
            Some(tls) => Kind::Tls {
                listener: tls_listener::builder(tls.acceptor.clone())
                    .handshake_timeout(HANDSHAKE_TIMEOUT)
                    .listen(listener),
                metrics: Arc::clone(metrics),
                failures: LogThrottle::new(HANDSHAKE_WARNING_INTERVAL),
            },
        };
        Listening {
            kind,
            limits: limits.clone(),
        }
    }
}

impl axum::serve::Listener for Listening {
    type Io = Bounded;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Bounded, SocketAddr) {
        // A permit first: at the cap, connections wait in the kernel's backlog, not here.
        // The semaphore is never closed; were it, serving unbounded beats not serving.
        let permit = Arc::clone(&self.limits.permits).acquire_owned().await.ok();
        let (connection, addr) = self.kind.accept().await;
        (Bounded::new(connection, permit, &self.limits), addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.kind {
            Kind::Cleartext(listener) => listener.local_addr(),
            Kind::Tls { listener, .. } => listener.local_addr(),
        }
    }
}

impl Kind {
    async fn accept(&mut self) -> (Connection, SocketAddr) {
        match self {
            Kind::Cleartext(listener) => {
                let (stream, addr) = axum::serve::Listener::accept(listener).await;
                // Answers are small and latency is the product: no Nagle delay.
                let _ = stream.set_nodelay(true);
                (Connection::Cleartext(stream), addr)
            }
            Kind::Tls {
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
                        if let Some(left_out) = failures.due(clock::monotonic()) {
                            let peer = e.peer_addr().map(ToString::to_string);
                            tracing::warn!(error = %e, peer, left_out, "a TLS handshake failed");
                        }
                    }
                }
            },
        }
    }
}

/// A connection holding its permit, closed (its reads fail) once nothing has passed over it
/// for the idle time (a half-sent request, an HTTP/2 preface and nothing after, a keep-alive
/// connection no one uses), or once a request has been coming in for the unanswered time with
/// no byte of answer (a client trickling its headers to hold the connection).
pub(crate) struct Bounded {
    connection: Connection,
    _permit: Option<OwnedSemaphorePermit>,
    idle: Duration,
    unanswered: Duration,
    last_activity: tokio::time::Instant,
    /// When the client began sending what the server has not yet begun to answer.
    unanswered_since: Option<tokio::time::Instant>,
    deadline: Pin<Box<Sleep>>,
}

impl Bounded {
    fn new(
        connection: Connection,
        permit: Option<OwnedSemaphorePermit>,
        limits: &ConnectionLimits,
    ) -> Bounded {
        let now = tokio::time::Instant::now();
        Bounded {
            connection,
            _permit: permit,
            idle: limits.idle,
            unanswered: limits.unanswered,
            last_activity: now,
            unanswered_since: None,
            deadline: Box::pin(tokio::time::sleep(limits.idle)),
        }
    }

    /// The client sent bytes.
    fn read_some(&mut self) {
        let now = tokio::time::Instant::now();
        self.last_activity = now;
        self.unanswered_since.get_or_insert(now);
        self.rearm();
    }

    /// The server sent bytes: whatever the client had sent is being answered.
    fn wrote_some(&mut self) {
        self.last_activity = tokio::time::Instant::now();
        self.unanswered_since = None;
        self.rearm();
    }

    /// `written`, after taking note of it: bytes out are an answer begun.
    fn noted(&mut self, written: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.wrote_some();
        }
        written
    }

    fn rearm(&mut self) {
        let idle_at = self.last_activity + self.idle;
        let at = match self.unanswered_since {
            Some(since) => idle_at.min(since + self.unanswered),
            None => idle_at,
        };
        self.deadline.as_mut().reset(at);
    }
}

impl AsyncRead for Bounded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.connection).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.read_some();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            // Waiting for the peer: the deadline wakes this read if nothing comes in time.
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the connection was idle, or its request unanswered, too long",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.connection).poll_write(cx, buf);
        this.noted(written)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.connection).poll_write_vectored(cx, bufs);
        this.noted(written)
    }

    fn is_write_vectored(&self) -> bool {
        self.connection.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().connection).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().connection).poll_shutdown(cx)
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
