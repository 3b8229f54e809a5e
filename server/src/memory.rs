//! Serving in the same process without sockets: a listener fed with in-memory streams.
//!
//! The simulator runs the server in its own process; over loopback TCP a third of a replay's
//! CPU went to the kernel moving bytes between its two halves. Over these streams requests are
//! still HTTP, encoded and parsed as on the wire; only the socket is gone.

use std::io;

use tokio::io::DuplexStream;
use tokio::sync::mpsc;

/// Bytes buffered in each direction of a connection.
const CONNECTION_BUFFER: usize = 256 * 1024;

/// The address of an in-memory listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryAddr;

/// The server's side: connections arrive here.
pub struct MemoryListener {
    incoming: mpsc::Receiver<DuplexStream>,
}

/// The client's side: opens connections to the listener.
#[derive(Clone, Debug)]
pub struct MemoryConnector {
    outgoing: mpsc::Sender<DuplexStream>,
}

/// A listener and a connector to it.
pub fn pair() -> (MemoryListener, MemoryConnector) {
    let (outgoing, incoming) = mpsc::channel(64);
    (MemoryListener { incoming }, MemoryConnector { outgoing })
}

impl MemoryConnector {
    /// Opens a connection; refused once the server has stopped.
    pub async fn connect(&self) -> io::Result<DuplexStream> {
        let (client, server) = tokio::io::duplex(CONNECTION_BUFFER);
        self.outgoing.send(server).await.map_err(|_| {
            io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "the in-process server has stopped",
            )
        })?;
        Ok(client)
    }
}

impl axum::serve::Listener for MemoryListener {
    type Io = DuplexStream;
    type Addr = MemoryAddr;

    async fn accept(&mut self) -> (DuplexStream, MemoryAddr) {
        match self.incoming.recv().await {
            Some(stream) => (stream, MemoryAddr),
            // Every connector is gone: nothing will ever connect again.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<MemoryAddr> {
        Ok(MemoryAddr)
    }
}
