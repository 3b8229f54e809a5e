//! What Redis does under the bench's load, and redis-benchmark calling the same script on it:
//! the baseline sluice-server is measured against.

use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use sluice_core::limit::{Algorithm, Limit};
use sluice_harness::{RedisServer, cpu};
use sluice_server::scripts::{SCRIPTS, ScriptCall, ScriptTime};

use super::workload::{KEYSPACE, LIMIT};

/// What Redis did over a span: its CPU time and the decisions it made.
#[derive(Debug, Clone, Copy, Default)]
pub struct RedisWork {
    /// CPU seconds, user and system.
    pub cpu_s: f64,
    /// Decisions: `GET`s, since every `gcra` decision reads its key once.
    pub decisions: u64,
}

impl RedisWork {
    /// Redis' counters now (`INFO`).
    pub(crate) fn read(redis: &RedisServer) -> anyhow::Result<RedisWork> {
        let info = redis.cli(&["INFO", "ALL"])?;
        let cpu = |name: &str| -> anyhow::Result<f64> {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse().ok())
                .with_context(|| format!("INFO has no {name}"))
        };
        Ok(RedisWork {
            cpu_s: cpu("used_cpu_user")? + cpu("used_cpu_sys")?,
            decisions: crate::memory::command_calls_in(&info)
                .get("get")
                .copied()
                .unwrap_or(0),
        })
    }

    /// Runs `work` and returns what it gave with what Redis did meanwhile.
    pub(super) fn during<T>(
        redis: &RedisServer,
        work: impl FnOnce() -> anyhow::Result<T>,
    ) -> anyhow::Result<(T, RedisWork)> {
        let before = RedisWork::read(redis)?;
        let out = work()?;
        let after = RedisWork::read(redis)?;
        Ok((
            out,
            RedisWork {
                cpu_s: after.cpu_s - before.cpu_s,
                decisions: after.decisions - before.decisions,
            },
        ))
    }

    /// Redis' CPU microseconds per decision.
    pub fn cpu_us_per_decision(&self) -> f64 {
        self.per_decision_us(self.cpu_s)
    }

    /// `cpu_s` seconds spent over the span, in microseconds per decision Redis made in it.
    pub fn per_decision_us(&self, cpu_s: f64) -> f64 {
        cpu_s * 1e6 / self.decisions as f64
    }
}

/// One redis-benchmark run: its calls per second and latency, and the CPU it and Redis spent.
#[derive(Debug, Clone, Copy)]
pub struct BenchmarkRun {
    /// Calls per second.
    pub rate: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
    /// What Redis did meanwhile.
    pub redis: RedisWork,
    /// CPU seconds redis-benchmark spent.
    pub client_cpu_s: f64,
}

impl BenchmarkRun {
    /// Runs redis-benchmark `requests` times `how`, over `concurrency` connections.
    pub(super) fn measure(
        redis: &RedisServer,
        concurrency: usize,
        requests: u64,
        how: Call,
    ) -> anyhow::Result<BenchmarkRun> {
        let ((calls, client_cpu_s), redis_work) = RedisWork::during(redis, || {
            let before = cpu::reaped_children()?;
            let calls = redis_benchmark(redis, concurrency, requests, how)?;
            Ok((calls, cpu::reaped_children()? - before))
        })?;
        let (rate, p99_ms) = calls;
        Ok(BenchmarkRun {
            rate,
            p99_ms,
            redis: redis_work,
            client_cpu_s,
        })
    }
}

/// How redis-benchmark calls the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Call {
    /// `EVALSHA` of its text.
    Eval,
    /// `FCALL` of its function in sluice's library, as sluice-server calls it.
    Function,
}

/// redis-benchmark calling the script `requests` times, `how`, over `concurrency` connections:
/// its calls per second and p99 latency (ms).
fn redis_benchmark(
    redis: &RedisServer,
    concurrency: usize,
    requests: u64,
    how: Call,
) -> anyhow::Result<(f64, f64)> {
    let script = SCRIPTS.get(Algorithm::Gcra);
    // Loaded here rather than trusting that sluice-server loaded it, so this baseline stands alone.
    let mut connection = redis::Client::open(redis.url())?.get_connection()?;
    let (command, callee) = match how {
        Call::Eval => ("EVALSHA", script.text().load(&mut connection)?),
        Call::Function => {
            SCRIPTS
                .library()
                .load_command()
                .query::<String>(&mut connection)?;
            ("FCALL", script.function().to_owned())
        }
    };
    // The very call sluice-server makes for one check, on keys that redis-benchmark draws from
    // the same keyspace. The server passes Redis' clock as it carries it; redis-benchmark
    // repeats one argument list, so every call gets this instant (Redis runs on this machine,
    // so the system clock is its clock).
    let now_us = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros(),
    )?;
    let limit: Limit = serde_json::from_str(LIMIT)?;
    let key = format!(
        "sluice:{{bench0:client-__rand_int__}}:{}",
        Algorithm::Gcra.storage_code()
    );
    let call = ScriptCall::new(&limit, key.clone(), ScriptTime::Carried(now_us), 1, false);
    let output = Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &redis.port().to_string(),
            "-c",
            &concurrency.to_string(),
        ])
        .args([
            "-n",
            &requests.to_string(),
            "-r",
            &KEYSPACE.to_string(),
            "--csv",
        ])
        .args([command, &callee, "1", &key])
        .args(call.args().iter().map(ToString::to_string))
        .stdin(Stdio::null())
        .output()
        .context("running redis-benchmark (apt-get install redis-tools)")?;
    let text = String::from_utf8_lossy(&output.stdout);
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    let row = text
        .lines()
        .find(|l| l.starts_with(&format!("\"{command}")))
        .with_context(|| format!("redis-benchmark said: {text}"))?;
    let fields: Vec<f64> = row
        .split(',')
        .skip(1)
        .map(|f| f.trim_matches('"').parse().unwrap_or(f64::NAN))
        .collect();
    let (Some(rps), Some(p99)) = (fields.first(), fields.get(5)) else {
        bail!("unexpected redis-benchmark output: {row}");
    };
    Ok((*rps, *p99))
}
