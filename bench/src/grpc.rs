//! Envoy's gRPC rate limit API beside `/v1/decide`, on one sluice-server in the same run: the
//! same decision (`gcra`, one descriptor or check, keys spread over 10,000 clients), asked
//! `ShouldRateLimit` by tonic clients and `POST /v1/decide` by the lean HTTP/1.1 load
//! generator over as many keep-alive connections as there are requests in flight.
//!
//! gRPC is asked twice: over as many HTTP/2 connections, one request in flight on each (like for
//! like with `/v1/decide`), and over one connection carrying every request in flight, as one
//! Envoy worker's rate limit filter multiplexes them (in a closed loop that one moves in
//! lockstep; BENCHMARKS.md's gRPC section says how).

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::bail;
use sluice_harness::{RedisServer, free_port};
use sluice_server::envoy_api::ratelimit::{
    Code, DescriptorEntry, RateLimitClient, RateLimitDescriptor, RateLimitRequest,
};

use crate::load::{self, CallerCounts, Measured};
use crate::server::{LIMIT, ServerProcess, SluiceCpu, bodies, client_key, wait_ready};

/// One API's run: its rate and latency, and the CPU it took.
#[derive(Debug, Clone)]
pub struct Side {
    /// Rate and latency.
    pub measured: Measured,
    /// What the client, the server and Redis spent on it.
    pub cpu: SluiceCpu,
}

/// The APIs, one run each, one after the other.
#[derive(Debug, Clone)]
pub struct Round {
    /// `ShouldRateLimit`, one request in flight on each of as many connections.
    pub grpc: Side,
    /// `ShouldRateLimit`, every request in flight on one connection.
    pub grpc_multiplexed: Side,
    /// `/v1/decide`.
    pub decide: Side,
}

impl Round {
    /// gRPC's decisions per second over `/v1/decide`'s, like for like (a connection a request
    /// in flight).
    pub fn ratio(&self) -> f64 {
        self.grpc.measured.rate() / self.decide.measured.rate()
    }

    /// gRPC's decisions per second over one multiplexed connection, over `/v1/decide`'s.
    pub fn multiplexed_ratio(&self) -> f64 {
        self.grpc_multiplexed.measured.rate() / self.decide.measured.rate()
    }
}

fn configuration() -> String {
    format!(
        "domain: bench\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 1000000\n      sluice: {LIMIT}\n"
    )
}

fn request(key: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![DescriptorEntry {
                key: "remote_address".to_owned(),
                value: format!("client-{key}"),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

/// `connections` HTTP/2 connections with `per_connection` callers on each, every caller asking
/// again when answered, for `warmup + duration`.
async fn grpc_load(
    addr: SocketAddr,
    (connections, per_connection): (usize, usize),
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<Measured> {
    let mut clients = Vec::with_capacity(connections);
    for _ in 0..connections {
        clients.push(RateLimitClient::connect(format!("http://{addr}")).await?);
    }
    let in_flight = connections * per_connection;
    let start = Instant::now();
    let (measure_from, stop) = (start + warmup, start + warmup + duration);
    let mut tasks = Vec::new();
    for caller in 0..in_flight {
        let mut client = clients[caller % connections].clone();
        tasks.push(tokio::spawn(async move {
            let mut counts = CallerCounts {
                latencies_us: Vec::with_capacity(1 << 16),
                ..CallerCounts::default()
            };
            let mut i = caller as u64;
            loop {
                let sent = Instant::now();
                if sent >= stop {
                    break;
                }
                let answered = client.should_rate_limit(request(client_key(i))).await;
                if sent >= measure_from {
                    let allowed =
                        matches!(answered, Ok(r) if r.get_ref().overall_code == Code::Ok as i32);
                    counts.count(allowed.then_some(200), sent.elapsed());
                }
                i += in_flight as u64;
            }
            Ok(counts)
        }));
    }
    Measured::gather(tasks, duration).await
}

/// `repeats` rounds at `in_flight` requests in flight, each API measured for `duration` after
/// a warm-up; rounds ordered by [`Round::ratio`].
pub fn run(in_flight: usize, duration: Duration, repeats: usize) -> anyhow::Result<Vec<Round>> {
    let redis = RedisServer::start()?;
    let dir = std::env::temp_dir().join(format!("sluice-bench-rls-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("bench.yaml"), configuration())?;
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let server =
        ServerProcess::start(addr, &redis, &[OsStr::new("--rls-config"), dir.as_os_str()])?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(wait_ready(addr))?;
    // The same decision as the gRPC side: one gcra check per request.
    let bodies = bodies(1)?;
    let warmup = Duration::from_secs(1);
    let measure = |api: &str, load: &dyn Fn() -> anyhow::Result<Measured>| {
        let (measured, cpu) = SluiceCpu::during(&redis, &server, load)?;
        if measured.errors > 0 {
            bail!(
                "{} {api} requests failed during the benchmark",
                measured.errors
            );
        }
        Ok(Side { measured, cpu })
    };
    let grpc_at = |layout| runtime.block_on(grpc_load(addr, layout, warmup, duration));
    let mut rounds = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        rounds.push(Round {
            grpc: measure("gRPC", &|| grpc_at((in_flight, 1)))?,
            grpc_multiplexed: measure("gRPC", &|| grpc_at((1, in_flight)))?,
            decide: measure("/v1/decide", &|| {
                runtime.block_on(load::run(
                    addr,
                    sluice_core::wire::DECIDE_PATH,
                    in_flight,
                    warmup,
                    duration,
                    &bodies,
                ))
            })?,
        });
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    rounds.sort_by(|a, b| a.ratio().total_cmp(&b.ratio()));
    Ok(rounds)
}
