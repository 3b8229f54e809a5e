//! A closed-loop HTTP/1.1 load generator: a fixed number of keep-alive connections, each
//! sending its next request when the last one is answered, as redis-benchmark does.
//!
//! It is deliberately lean, as redis-benchmark is on its side of the baseline: every request
//! is built before the run, written in one call, and its answer read with `httparse` on the
//! connection's own task. Load generator, server and Redis share the machine, so what the
//! client spends is taken from the other two.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Requests answered 200 after the warm-up.
    pub requests: u64,
    /// Requests answered 429 (rate limited) after the warm-up.
    pub limited: u64,
    /// Requests answered otherwise.
    pub errors: u64,
    /// The measured span.
    pub elapsed: Duration,
    /// Latencies in microseconds of the answers 200 and 429, sorted.
    pub latencies_us: Vec<u32>,
}

/// What one closed-loop caller counted after the warm-up.
#[derive(Debug, Default)]
pub struct CallerCounts {
    /// Answered 200.
    pub ok: u64,
    /// Answered 429.
    pub limited: u64,
    /// Failed, or answered otherwise.
    pub errors: u64,
    /// Each 200's and 429's latency, µs.
    pub latencies_us: Vec<u32>,
}

impl CallerCounts {
    /// Counts `status`, answered `latency` after it was sent.
    pub fn count(&mut self, status: Option<u16>, latency: Duration) {
        let latency_us = u32::try_from(latency.as_micros()).unwrap_or(u32::MAX);
        match status {
            Some(200) => self.ok += 1,
            Some(429) => self.limited += 1,
            _ => {
                self.errors += 1;
                return;
            }
        }
        self.latencies_us.push(latency_us);
    }
}

impl Measured {
    /// The sum of every caller's counts over the measured `duration`.
    pub async fn gather(
        callers: Vec<tokio::task::JoinHandle<anyhow::Result<CallerCounts>>>,
        duration: Duration,
    ) -> anyhow::Result<Measured> {
        let mut measured = Measured {
            requests: 0,
            limited: 0,
            errors: 0,
            elapsed: duration,
            latencies_us: Vec::new(),
        };
        for caller in callers {
            let counts = caller.await??;
            measured.requests += counts.ok;
            measured.limited += counts.limited;
            measured.errors += counts.errors;
            measured.latencies_us.extend(counts.latencies_us);
        }
        measured.latencies_us.sort_unstable();
        Ok(measured)
    }

    /// Adds `other`'s counts and span to these, as one run measured over both spans.
    pub fn absorb(&mut self, other: Measured) {
        self.requests += other.requests;
        self.limited += other.limited;
        self.errors += other.errors;
        self.elapsed += other.elapsed;
        self.latencies_us.extend(other.latencies_us);
        self.latencies_us.sort_unstable();
    }

    /// Requests answered 200 a second.
    pub fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Requests answered 200 or 429.
    pub fn answered(&self) -> u64 {
        self.requests + self.limited
    }

    /// Requests answered 200 or 429 a second.
    pub fn answered_rate(&self) -> f64 {
        self.answered() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `q` quantile of latency, in milliseconds.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return f64::NAN;
        }
        let i = ((self.latencies_us.len() as f64 - 1.0) * q).round() as usize;
        f64::from(self.latencies_us[i]) / 1000.0
    }
}

/// Sends `POST path` with the bodies `bodies` (in turn) over `connections` connections to
/// `addr` for `warmup + duration`; only the part after the warm-up is measured.
pub async fn run(
    addr: SocketAddr,
    path: &'static str,
    connections: usize,
    warmup: Duration,
    duration: Duration,
    bodies: &[Bytes],
) -> anyhow::Result<Measured> {
    let requests: Arc<[Bytes]> = bodies.iter().map(|b| request(path, b)).collect();
    run_requests(addr, requests, connections, warmup, duration).await
}

/// Sends `requests` (whole, head and body; in turn) over `connections` connections to `addr`
/// for `warmup + duration`; only the part after the warm-up is measured.
pub async fn run_requests(
    addr: SocketAddr,
    requests: Arc<[Bytes]>,
    connections: usize,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<Measured> {
    if requests.is_empty() {
        bail!("no requests to send");
    }
    let start = Instant::now();
    let measure_from = start + warmup;
    let stop = measure_from + duration;
    let mut tasks = Vec::new();
    for connection in 0..connections {
        let requests = Arc::clone(&requests);
        tasks.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            let mut buffer = vec![0u8; 16 * 1024];
            let mut counts = CallerCounts {
                latencies_us: Vec::with_capacity(1 << 16),
                ..CallerCounts::default()
            };
            let mut i = connection;
            loop {
                let sent = Instant::now();
                if sent >= stop {
                    break;
                }
                stream.write_all(&requests[i % requests.len()]).await?;
                let status = read_response(&mut stream, &mut buffer).await?;
                if sent >= measure_from {
                    counts.count(Some(status), sent.elapsed());
                }
                i = i.wrapping_add(connections);
            }
            Ok::<_, anyhow::Error>(counts)
        }));
    }
    Measured::gather(tasks, duration).await
}

/// The whole request, head and body.
fn request(path: &str, body: &[u8]) -> Bytes {
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nhost: sluice\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    Bytes::from(request)
}

/// Reads one response (head and `content-length` body) and returns its status.
async fn read_response(stream: &mut TcpStream, buffer: &mut [u8]) -> anyhow::Result<u16> {
    let mut filled = 0;
    loop {
        if filled == buffer.len() {
            bail!("a response longer than {} bytes", buffer.len());
        }
        let n = stream.read(&mut buffer[filled..]).await?;
        if n == 0 {
            bail!("the server closed the connection");
        }
        filled += n;
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut response = httparse::Response::new(&mut headers);
        let httparse::Status::Complete(head) = response.parse(&buffer[..filled])? else {
            continue;
        };
        let length: usize = response
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
            .context("a response without content-length")
            .and_then(|h| Ok(std::str::from_utf8(h.value)?.parse()?))?;
        let status = response.code.context("a response without a status")?;
        // Keep-alive answers here are one at a time: the rest of this one is all that follows.
        let mut rest = (head + length).saturating_sub(filled);
        let capacity = buffer.len();
        while rest > 0 {
            let n = stream.read(&mut buffer[..rest.min(capacity)]).await?;
            if n == 0 {
                bail!("the server closed the connection mid-answer");
            }
            rest -= n;
        }
        return Ok(status);
    }
}
