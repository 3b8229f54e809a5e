//! A closed-loop HTTP load generator: a fixed number of connections, each sending its next
//! request when the last one is answered, as redis-benchmark does.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Requests answered 200 after the warm-up.
    pub requests: u64,
    /// Requests answered otherwise.
    pub errors: u64,
    /// The measured span.
    pub elapsed: Duration,
    /// Latencies in microseconds, sorted.
    pub latencies_us: Vec<u32>,
}

impl Measured {
    /// Requests per second.
    pub fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
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

/// Sends POST `path` with bodies from `body(i)` over `connections` connections to `addr` for
/// `warmup + duration`; only the part after the warm-up is measured.
pub async fn run(
    addr: SocketAddr,
    path: &'static str,
    connections: usize,
    warmup: Duration,
    duration: Duration,
    body: impl Fn(u64) -> Bytes + Clone + Send + 'static,
) -> anyhow::Result<Measured> {
    let start = Instant::now();
    let measure_from = start + warmup;
    let stop = measure_from + duration;
    let mut tasks = Vec::new();
    for connection in 0..connections {
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(conn);
            let (mut ok, mut errors, mut latencies) = (0u64, 0u64, Vec::with_capacity(1 << 16));
            let mut i = connection as u64;
            loop {
                let sent = Instant::now();
                if sent >= stop {
                    break;
                }
                let request = http::Request::post(path)
                    .header(http::header::HOST, "sluice")
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(Full::new(body(i)))?;
                let response = sender.send_request(request).await?;
                let status = response.status();
                response.into_body().collect().await?;
                if sent >= measure_from {
                    if status == http::StatusCode::OK {
                        ok += 1;
                        latencies
                            .push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
                    } else {
                        errors += 1;
                    }
                }
                i = i.wrapping_add(connections as u64);
            }
            Ok::<_, anyhow::Error>((ok, errors, latencies))
        }));
    }
    let mut measured = Measured {
        requests: 0,
        errors: 0,
        elapsed: duration,
        latencies_us: Vec::new(),
    };
    for task in tasks {
        let (ok, errors, latencies) = task.await??;
        measured.requests += ok;
        measured.errors += errors;
        measured.latencies_us.extend(latencies);
    }
    measured.latencies_us.sort_unstable();
    Ok(measured)
}
