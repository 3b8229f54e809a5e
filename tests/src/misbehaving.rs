//! A stand-in for sluice-server that fails on purpose, in each of the ways the filter must
//! survive. It holds no limit state: it only answers badly.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// How it answers every request.
#[derive(Debug, Clone)]
pub enum Misbehaviour {
    /// Reads the request and never answers.
    Hang,
    /// Answers this status and body.
    Answer(u16, &'static str),
    /// Sends headers promising a body, a piece of it, then closes the connection.
    ResetMidBody,
    /// Answers 200 with a body of this many bytes.
    Sized(usize),
}

/// A misbehaving service on a free loopback port, for as long as the runtime lives.
pub async fn start(misbehaviour: Misbehaviour) -> SocketAddr {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let misbehaviour = misbehaviour.clone();
            tokio::spawn(async move {
                let mut request = vec![0u8; 65536];
                let _ = stream.read(&mut request).await;
                match misbehaviour {
                    Misbehaviour::Hang => {
                        tokio::time::sleep(std::time::Duration::from_secs(3600)).await
                    }
                    Misbehaviour::Answer(status, body) => {
                        let response = format!(
                            "HTTP/1.1 {status} Whatever\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = stream.write_all(response.as_bytes()).await;
                    }
                    Misbehaviour::ResetMidBody => {
                        let response = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"results\":[";
                        let _ = stream.write_all(response.as_bytes()).await;
                    }
                    Misbehaviour::Sized(len) => {
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
                        );
                        let _ = stream.write_all(head.as_bytes()).await;
                        let _ = stream.write_all(&vec![b'x'; len]).await;
                    }
                }
            });
        }
    });
    addr
}
