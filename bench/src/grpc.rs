//! Envoy's gRPC rate limit API beside `/v1/decide`, on one sluice-server in the same run: the
//! same decision (`gcra`, one descriptor or check, keys spread over 10,000 clients), asked
//! `ShouldRateLimit` by a tonic client over one HTTP/2 connection (as Envoy's native filter
//! asks, multiplexed), and `POST /v1/decide` by the lean HTTP/1.1 load generator over as many
//! keep-alive connections as the gRPC client has requests in flight.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::bail;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice_harness::{RedisServer, free_port};

use crate::load::{self, Measured};
use crate::server::{LIMIT, ServerProcess, bodies, client_key, wait_ready};

/// The two APIs' rates in one pair of runs.
#[derive(Debug, Clone)]
pub struct Pair {
    /// `ShouldRateLimit`.
    pub grpc: Measured,
    /// `/v1/decide`.
    pub decide: Measured,
}

impl Pair {
    /// gRPC's decisions per second over `/v1/decide`'s.
    pub fn ratio(&self) -> f64 {
        self.grpc.rate() / self.decide.rate()
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
            entries: vec![Entry {
                key: "remote_address".to_owned(),
                value: format!("client-{key}"),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

/// `in_flight` callers, each asking again when answered, for `warmup + duration`.
async fn grpc_load(
    addr: SocketAddr,
    in_flight: usize,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<Measured> {
    let client = RateLimitServiceClient::connect(format!("http://{addr}")).await?;
    let start = Instant::now();
    let (measure_from, stop) = (start + warmup, start + warmup + duration);
    let mut tasks = Vec::new();
    for caller in 0..in_flight {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut errors, mut latencies) = (0u64, 0u64, Vec::with_capacity(1 << 16));
            let mut i = caller as u64;
            loop {
                let sent = Instant::now();
                if sent >= stop {
                    break;
                }
                let answered = client.should_rate_limit(request(client_key(i))).await;
                if sent >= measure_from {
                    match answered {
                        Ok(r) if r.get_ref().overall_code == Code::Ok as i32 => {
                            ok += 1;
                            latencies
                                .push(sent.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                        }
                        _ => errors += 1,
                    }
                }
                i += in_flight as u64;
            }
            Ok((ok, errors, latencies))
        }));
    }
    Measured::gather(tasks, duration).await
}

/// `repeats` pairs at `in_flight` requests in flight, each API measured for `duration` after a
/// warm-up; pairs ordered by ratio.
pub fn run(in_flight: usize, duration: Duration, repeats: usize) -> anyhow::Result<Vec<Pair>> {
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
    let mut pairs = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        let grpc = runtime.block_on(grpc_load(addr, in_flight, warmup, duration))?;
        let decide = runtime.block_on(load::run(
            addr,
            sluice_core::wire::DECIDE_PATH,
            in_flight,
            warmup,
            duration,
            &bodies,
        ))?;
        if grpc.errors > 0 || decide.errors > 0 {
            bail!(
                "{} gRPC and {} /v1/decide requests failed during the benchmark",
                grpc.errors,
                decide.errors
            );
        }
        pairs.push(Pair { grpc, decide });
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    pairs.sort_by(|a, b| a.ratio().total_cmp(&b.ratio()));
    Ok(pairs)
}
