//! What sluice costs inside a real Envoy, beside what Envoy costs with no filter, with a no-op
//! wasm filter and with its own native filters, on the same traffic in the same rounds.
//!
//! One Envoy 1.40 (V8) with one worker a round, holding a listener for every setup, each
//! listener's route going to a further listener of the same Envoy answering 200; the release
//! sluice-server (sleeping when idle, as it runs by default) and Redis on the same machine; the
//! bench's closed-loop load generator on one thread. The setups take short turns, one listener
//! loaded at a time, so that a slow minute of the machine weighs on every setup alike: a
//! setup's figure in a round is the sum of its turns, and every figure is a median over rounds.

mod config;
mod instructions;
mod pin;
mod plan;
mod report;
mod setup;

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use sluice_harness::{Envoy, RedisServer, cpu, free_port};

use crate::filter::Modules;
use crate::load;
use crate::server::{RedisWork, ServerProcess};

use plan::{
    CONNECTIONS, Keys, LIMIT_BURST, LIMIT_RATE, OVER_LIMIT, OverLimit, Results, Run,
    START_UPS_A_ROUND, TURN_WARMUP, TURNS, WORKERS,
};
pub use report::section;
pub use setup::{SERVER_THREADS, Setup};

/// The processes every run shares.
struct Stack {
    redis: RedisServer,
    server: ServerProcess,
    threaded_server: ServerProcess,
    addresses: config::Addresses,
    _rls_dir: tempfile::TempDir,
}

impl Stack {
    fn start() -> anyhow::Result<Stack> {
        let redis = RedisServer::start()?;
        let rls_dir = tempfile::tempdir()?;
        let rls = rls_dir.path().join("rls");
        std::fs::create_dir(&rls)?;
        std::fs::write(rls.join("bench.yaml"), config::RLS_CONFIG)?;
        std::fs::write(rls.join("limited.yaml"), config::rls_limited())?;
        let rlqs = rls_dir.path().join("rlqs.yaml");
        std::fs::write(&rlqs, config::rlqs_limited())?;
        let local = |port| SocketAddr::from(([127, 0, 0, 1], port));
        let addresses = config::Addresses {
            ingress: local(free_port()?),
            origin: local(free_port()?),
            server: local(free_port()?),
            threaded_server: local(free_port()?),
        };
        let threads = SERVER_THREADS.to_string();
        let with_rls = |threads: &str| -> Vec<String> {
            vec![
                "--rls-config".into(),
                rls.display().to_string(),
                "--rlqs-config".into(),
                rlqs.display().to_string(),
                "--threads".into(),
                threads.into(),
            ]
        };
        let spawn = |addr, flags: Vec<String>| {
            let flags: Vec<&OsStr> = flags.iter().map(OsStr::new).collect();
            ServerProcess::spawn_release(addr, &redis, &flags)
        };
        let server = spawn(addresses.server, with_rls("1"))?;
        let threaded_server = spawn(addresses.threaded_server, with_rls(&threads))?;
        let runtime = load_runtime()?;
        for addr in [addresses.server, addresses.threaded_server] {
            runtime.block_on(crate::server::wait_ready(addr))?;
        }
        Ok(Stack {
            redis,
            server,
            threaded_server,
            addresses,
            _rls_dir: rls_dir,
        })
    }

    fn server_cpu_s(&self) -> anyhow::Result<f64> {
        Ok(cpu::process_threads(self.server.pid())?
            + cpu::process_threads(self.threaded_server.pid())?)
    }
}

/// The load generator's runtime: one thread, as in the other sections.
fn load_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// `GET /` with `x-api-key` cycling through `keys`.
fn requests(keys: Keys) -> Arc<[Bytes]> {
    (0..keys.count())
        .map(|k| {
            Bytes::from(format!(
                "GET / HTTP/1.1\r\nhost: bench\r\nx-api-key: key-{k}\r\n\r\n"
            ))
        })
        .collect()
}

/// From Envoy's start to its `/ready`, with `setup`'s filters alone.
fn start_up(stack: &Stack, wasm: &config::Wasm<'_>, setup: Setup) -> anyhow::Result<Duration> {
    let yaml = config::envoy_yaml(setup, &stack.addresses, wasm)?;
    let started = Instant::now();
    let mut envoy = Envoy::start(&yaml, WORKERS).context("starting Envoy")?;
    let start_up = started.elapsed();
    envoy.stop();
    Ok(start_up)
}

/// The Envoy of a round, with a listener for each setup.
struct Shared {
    envoy: Envoy,
    pid: u32,
    listeners: Vec<(Setup, SocketAddr)>,
    /// The requests of each key spread, built once for all the turns.
    hot_requests: Arc<[Bytes]>,
    many_requests: Arc<[Bytes]>,
    runtime: tokio::runtime::Runtime,
    // Dropped last: once Envoy has stopped, the others may use every core again.
    _pinned: pin::Pinned,
}

impl Shared {
    fn start(stack: &Stack, wasm: &config::Wasm<'_>, setups: &[Setup]) -> anyhow::Result<Shared> {
        let listeners = setups
            .iter()
            .map(|&setup| Ok((setup, SocketAddr::from(([127, 0, 0, 1], free_port()?)))))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let yaml = config::shared_envoy_yaml(&listeners, &stack.addresses, wasm)?;
        let envoy = Envoy::start(&yaml, WORKERS).context("starting Envoy")?;
        let pid = envoy.pid().context("Envoy has no process")?;
        let mut others = vec![
            std::process::id(),
            stack.server.pid(),
            stack.threaded_server.pid(),
        ];
        others.extend(stack.redis.pid());
        let pinned = pin::Pinned::new(pid, others)?;
        Ok(Shared {
            envoy,
            pid,
            listeners,
            hot_requests: requests(Keys::Hot),
            many_requests: requests(Keys::Many),
            runtime: load_runtime()?,
            _pinned: pinned,
        })
    }

    /// Requests Envoy has sent sluice-server, over every cluster to it.
    fn calls(&self) -> anyhow::Result<u64> {
        [
            config::SERVER_CLUSTER,
            config::THREADED_SERVER_CLUSTER,
            config::RLS_CLUSTER,
        ]
        .into_iter()
        .map(|cluster| {
            Ok(self
                .envoy
                .stat(&format!("cluster.{cluster}.upstream_rq_total"))?)
        })
        .sum()
    }

    /// `setup`'s turn: its listener loaded with `keys` for `span` after [`TURN_WARMUP`], and
    /// what Envoy, sluice-server and Redis spent over the span.
    fn turn(&self, stack: &Stack, setup: Setup, keys: Keys, span: Duration) -> anyhow::Result<Run> {
        let (_, address) = *self
            .listeners
            .iter()
            .find(|(s, _)| *s == setup)
            .context("a setup with no listener")?;
        let requests = match keys {
            Keys::Hot => &self.hot_requests,
            Keys::Many => &self.many_requests,
        };
        let load = |span| {
            self.runtime.block_on(load::run_requests(
                address,
                Arc::clone(requests),
                CONNECTIONS,
                Duration::ZERO,
                span,
            ))
        };
        load(TURN_WARMUP)?;
        let (calls_before, envoy_before, server_before) = (
            self.calls()?,
            cpu::process_threads(self.pid)?,
            stack.server_cpu_s()?,
        );
        let redis_before = RedisWork::read(&stack.redis)?;
        let measured = load(span)?;
        let cpu_s = [
            cpu::process_threads(self.pid)? - envoy_before,
            stack.server_cpu_s()? - server_before,
            RedisWork::read(&stack.redis)?.cpu_s - redis_before.cpu_s,
        ];
        let calls = self.calls()? - calls_before;
        if measured.errors > 0 {
            bail!(
                "{} of {} requests failed with {} on {keys:?} keys",
                measured.errors,
                measured.errors + measured.answered(),
                setup.name()
            );
        }
        // Requests in flight when the calls are read may be counted on either side: at most
        // one a connection.
        let answered = measured.answered();
        if setup.asks_every_request() && calls + (CONNECTIONS as u64) < answered {
            bail!(
                "{} sent sluice-server {calls} calls for {answered} requests on {keys:?} keys: its callouts do not reach the server",
                setup.name()
            );
        }
        Ok(Run {
            measured,
            cpu_s,
            calls,
        })
    }
}

/// What to run.
pub struct Options {
    /// Rounds of every setup.
    pub rounds: usize,
    /// Seconds each setup is measured for.
    pub seconds: u64,
    /// Only the setups with these ids ([`Setup::id`]); every one when empty.
    pub only: Vec<String>,
    /// Print the filter's and the clusters' stats after each run, to see what it did.
    pub show_stats: bool,
    /// Also count Envoy's instructions a request under callgrind, for the setups of the
    /// module's bars (those `only` names, where it names any).
    pub instructions: bool,
}

/// `rounds` rounds of every setup on both key spreads (those `only` names, where it names
/// any), `seconds` each a round in [`TURNS`] turns that rotate through the setups, then their
/// start-up times and the lease's bound.
pub fn run(modules: &Modules, options: &Options) -> anyhow::Result<Results> {
    let Options {
        rounds,
        seconds,
        ref only,
        show_stats,
        instructions,
    } = *options;
    let stack = Stack::start()?;
    let absolute = |path: &std::path::Path| {
        path.canonicalize()
            .with_context(|| format!("{}: build it (make wasm)", path.display()))
    };
    let (sluice, noop) = (absolute(&modules.sluice)?, absolute(&modules.noop)?);
    let wasm = config::Wasm {
        sluice: &sluice,
        noop: &noop,
    };
    let mut order: Vec<(Keys, Setup)> = [Keys::Hot, Keys::Many]
        .into_iter()
        .flat_map(|keys| Setup::COMPARED.map(|setup| (keys, setup)))
        .chain([(Keys::Hot, Setup::SluiceDenying)])
        .filter(|(_, setup)| named(only, *setup))
        .collect();
    let mut setups: Vec<Setup> = Vec::new();
    for &(_, setup) in &order {
        if !setups.contains(&setup) {
            setups.push(setup);
        }
    }
    let mut runs: Vec<(Keys, Setup, Vec<Run>)> =
        order.iter().map(|&(k, s)| (k, s, Vec::new())).collect();
    let mut start_ups: Vec<(Setup, Vec<Duration>)> =
        setups.iter().map(|&s| (s, Vec::new())).collect();
    let span = Duration::from_secs_f64(seconds as f64 / TURNS as f64);
    for round in 0..rounds {
        for (setup, times) in &mut start_ups {
            eprintln!(
                "envoy: round {}/{rounds}: start-up with {}",
                round + 1,
                setup.name()
            );
            for _ in 0..START_UPS_A_ROUND {
                times.push(start_up(&stack, &wasm, *setup)?);
            }
        }
        let shared = Shared::start(&stack, &wasm, &setups)?;
        let mut round_runs: Vec<Option<Run>> = vec![None; order.len()];
        for turn in 0..TURNS {
            eprintln!(
                "envoy: round {}/{rounds}, turn {}/{TURNS}: {} setups, {:.1} s each",
                round + 1,
                turn + 1,
                order.len(),
                span.as_secs_f64()
            );
            // Each setup follows another one from turn to turn.
            order.rotate_left(1);
            for &(keys, setup) in &order {
                let measured = shared.turn(&stack, setup, keys, span)?;
                let slot = runs
                    .iter()
                    .position(|(k, s, _)| (*k, *s) == (keys, setup))
                    .context("a setup with no slot")?;
                match &mut round_runs[slot] {
                    Some(sum) => sum.absorb(measured),
                    none => *none = Some(measured),
                }
            }
        }
        if show_stats {
            let stats = shared.envoy.admin_get("/stats?filter=sluice")?;
            eprintln!("{}", stats.trim_end());
        }
        drop(shared);
        for (slot, run) in runs.iter_mut().zip(round_runs) {
            slot.2.extend(run);
        }
    }
    let mut over_limit = Vec::new();
    // `--rounds 0` (instructions alone) measures none of them either.
    let over_limit_setups = OVER_LIMIT
        .into_iter()
        .filter(|setup| rounds > 0 && named(only, *setup));
    for setup in over_limit_setups {
        eprintln!("envoy: {} over its limit", setup.name());
        // Each way meets the limit afresh: the .wasm's and the module's rules are the same
        // Redis keys, and a run before would have spent the burst the next one's exact counts.
        stack.redis.cli(&["FLUSHALL"])?;
        over_limit.push(measure_over_limit(&stack, &wasm, setup, seconds)?);
    }
    let mut counts = Vec::new();
    if instructions {
        // Round by round, as the CPU rounds go: a slow stretch of the machine then weighs on
        // every setup alike.
        for round in 0..instructions::ROUNDS {
            let one_key = instructions::COUNTED.map(|setup| (setup, 1));
            let hot_keys = instructions::COUNTED_ON_HOT_KEYS
                .map(|setup| (setup, instructions::COUNTED_HOT_KEYS));
            let counted = one_key
                .into_iter()
                .chain(hot_keys)
                .filter(|(setup, _)| named(only, *setup));
            for (setup, keys) in counted {
                eprintln!(
                    "envoy: count {}/{}: {} on {keys} key(s) under callgrind",
                    round + 1,
                    instructions::ROUNDS,
                    instructions::counted_name(setup)
                );
                counts.push(instructions::count(
                    &stack.addresses,
                    &wasm,
                    setup,
                    keys,
                    round,
                )?);
            }
        }
    }
    Ok(Results {
        seconds,
        turns: TURNS,
        runs,
        start_ups,
        over_limit,
        counts,
    })
}

/// Whether `--only` takes `setup`: it names it, or names none.
fn named(only: &[String], setup: Setup) -> bool {
    only.is_empty() || only.iter().any(|o| o == setup.id())
}

/// The lease's `max_total_share` (its default).
const MAX_TOTAL_SHARE: f64 = 0.5;

/// `setup` on the hot keys offered far more than [`limit`], from Envoy's first request.
fn measure_over_limit(
    stack: &Stack,
    wasm: &config::Wasm<'_>,
    setup: Setup,
    seconds: u64,
) -> anyhow::Result<OverLimit> {
    let yaml = config::envoy_yaml(setup, &stack.addresses, wasm)?;
    let mut envoy = Envoy::start(&yaml, WORKERS)?;
    let runtime = load_runtime()?;
    let reports_before = quota_reports(stack)?;
    let started = Instant::now();
    let measured = runtime.block_on(load::run_requests(
        stack.addresses.ingress,
        requests(Keys::Hot),
        CONNECTIONS,
        Duration::ZERO,
        Duration::from_secs(seconds),
    ))?;
    // The span from the first request sent to the last answered.
    let span = started.elapsed().as_secs_f64();
    let messages = match setup {
        Setup::SluiceLeaseLimited | Setup::SluiceModuleLeaseLimited => {
            envoy.stat("cluster.sluice.upstream_rq_total")?
        }
        Setup::NativeGrpcLimited => envoy.stat("cluster.sluice_rls.upstream_rq_total")?,
        _ => quota_reports(stack)? - reports_before,
    };
    envoy.stop();
    if measured.errors > 0 {
        bail!(
            "{} requests failed with {} over its limit",
            measured.errors,
            setup.name()
        );
    }
    let keys = Keys::Hot.count() as f64;
    let (rate, burst) = (f64::from(LIMIT_RATE), f64::from(LIMIT_BURST));
    let exact = keys * (burst + rate * span);
    // docs/algorithms.md: lease mode adds what the holders may hold; the quota filter the
    // algorithm's bound over two more fill intervals (1 s each) and one refill of each Envoy's
    // bucket (its share over 1 s), with no request admitted before the first assignment
    // (`no_assignment_behavior` denies here); the native filter asks per request.
    let bound = match setup {
        Setup::SluiceLeaseLimited | Setup::SluiceModuleLeaseLimited => {
            exact + keys * MAX_TOTAL_SHARE * burst
        }
        Setup::RlqsLimited => keys * (burst + rate * (span + 2.0)) + keys * rate,
        _ => exact,
    };
    Ok(OverLimit {
        setup,
        seconds: span,
        admitted: measured.requests,
        denied: measured.limited,
        messages,
        exact: exact.floor() as u64,
        bound: bound.floor() as u64,
    })
}

/// The usage reports sluice-server has taken in, from its `/metrics`.
fn quota_reports(stack: &Stack) -> anyhow::Result<u64> {
    let reports =
        sluice_harness::http::metric(stack.addresses.server, "sluice_rlqs_reports_total")?;
    Ok(reports as u64)
}
