//! The service an Envoy under test protects: answers every request 200 with a short body, on
//! keep-alive connections, as the compose files' echo service does.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

/// What the upstream answers.
pub const UPSTREAM_BODY: &str = "hello from upstream\n";

/// An HTTP/1.1 server on a free loopback port; stops accepting when dropped.
pub struct Upstream {
    addr: SocketAddr,
    stopped: Arc<AtomicBool>,
    served: Arc<AtomicU64>,
}

impl Upstream {
    /// Starts it.
    pub fn start() -> std::io::Result<Upstream> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stopped = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicU64::new(0));
        let (accepting, counting) = (Arc::clone(&stopped), Arc::clone(&served));
        thread::spawn(move || {
            while !accepting.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((connection, _)) => {
                        let counting = Arc::clone(&counting);
                        thread::spawn(move || serve(connection, &counting));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Ok(Upstream {
            addr,
            stopped,
            served,
        })
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many requests it has answered.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::SeqCst)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
    }
}

/// Answers each request on `connection` (bodies are not expected: the tests send GETs).
fn serve(connection: TcpStream, served: &AtomicU64) {
    let _ = connection.set_nonblocking(false);
    let _ = connection.set_nodelay(true);
    let Ok(mut writer) = connection.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(connection);
    let mut line = String::new();
    loop {
        // The request line and the header fields, to the blank line.
        let mut close = false;
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" || line == "\n" => break,
                Ok(_) => {
                    let lower = line.to_ascii_lowercase();
                    close |= lower.starts_with("connection:") && lower.contains("close");
                }
            }
        }
        served.fetch_add(1, Ordering::SeqCst);
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{UPSTREAM_BODY}",
            UPSTREAM_BODY.len()
        );
        if writer.write_all(answer.as_bytes()).is_err() || close {
            return;
        }
    }
}
