//! Redis memory per key for each algorithm (`MEMORY USAGE`), and Redis commands per decision,
//! on a redis-server this starts. `docs/algorithms.md` quotes these numbers.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use redis::aio::MultiplexedConnection;
use sluice_core::key::{LimitKey, RuleName, redis_key};
use sluice_core::limit::{Algorithm, Limit};
use sluice_harness::RedisServer;
use sluice_server::scripts::{SCRIPTS, ScriptCall, ScriptTime};
use sluice_server::store::time::read_time_us;

const NOW: i64 = 1_763_700_000_000_000;

async fn decide(
    c: &mut MultiplexedConnection,
    limit: &Limit,
    key: &str,
    time: ScriptTime,
    cost: u64,
) -> anyhow::Result<()> {
    let call = ScriptCall::new(limit, key.to_owned(), time, cost, false);
    // As sluice-server calls it, the library loaded first (see `run`).
    let _: redis::Value = call
        .script()
        .fcall(std::slice::from_ref(&call.key), &call.args())
        .query_async(c)
        .await?;
    Ok(())
}

async fn usage(c: &mut MultiplexedConnection, key: &str) -> anyhow::Result<i64> {
    Ok(redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(c)
        .await?)
}

/// Calls per command, from `INFO commandstats`.
pub(crate) async fn command_calls(
    c: &mut MultiplexedConnection,
) -> anyhow::Result<BTreeMap<String, u64>> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await?;
    Ok(command_calls_in(&info))
}

/// Calls per command in the text of `INFO` (`cmdstat_get:calls=705407,usec=...`); a command
/// not yet run has no line.
pub(crate) fn command_calls_in(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|l| {
            let (name, stats) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// Redis commands run per decision (the FCALL and every `redis.call` inside the function),
/// averaged over 1,000 decisions on 100 keys, with the time `at(i)` for decision `i`.
async fn commands_per_decision(
    c: &mut MultiplexedConnection,
    limit: &Limit,
    at: impl Fn(i64) -> ScriptTime,
) -> anyhow::Result<f64> {
    let total = |calls: BTreeMap<String, u64>| -> u64 {
        calls
            .into_iter()
            .filter(|(n, _)| n != "info")
            .map(|(_, v)| v)
            .sum()
    };
    let before = total(command_calls(c).await?);
    let decisions = 1000;
    for i in 0..decisions {
        decide(
            c,
            limit,
            &format!("count:{:?}:{}:{}", at(0), limit.algorithm(), i % 100),
            at(i),
            1,
        )
        .await?;
    }
    let after = total(command_calls(c).await?);
    Ok((after - before) as f64 / decisions as f64)
}

fn state_of(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => "string `<window>:<count>`",
        Algorithm::SlidingLog => "sorted set, a member `<end>/<units>` per admitted request",
        Algorithm::SlidingWindow => "string `<window>:<current>:<previous>`",
        Algorithm::TokenBucket => "integer `<us>` or string `<us>:<ticks>` (full again at)",
        Algorithm::LeakyBucket => "integer `<us>` or string `<us>:<ticks>` (empty at)",
        Algorithm::Gcra => "integer `<us>` or string `<us>:<ticks>` (the TAT)",
    }
}

/// Runs the measurements; returns Markdown.
pub async fn run() -> anyhow::Result<String> {
    let mut out = String::new();
    let redis = RedisServer::start()?;
    let mut c = redis::Client::open(redis.url())?
        .get_multiplexed_async_connection()
        .await?;
    SCRIPTS
        .library()
        .load_command()
        .query_async::<String>(&mut c)
        .await?;
    let info: String = redis::cmd("INFO").arg("server").query_async(&mut c).await?;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    // A realistic key: prefix, hash tag with rule and client address, layout code, the
    // limit's parameters.
    let rule = RuleName::new("per-client")?;
    let client = LimitKey::from_parts([b"203.0.113.77".as_slice()]);
    let key = |limit: &Limit| redis_key("sluice", &rule, &client, limit);
    writeln!(
        out,
        "Redis {version}; `MEMORY USAGE <key> SAMPLES 0` for the key `sluice:{{per-client:203.0.113.77}}:<code>:<parameters>` \
         after 5 decisions; Redis commands per decision from `INFO commandstats` over 1,000 decisions \
         (the `FCALL` and each `redis.call` inside the function): as sluice-server runs them, on \
         Redis' clock as the server carries it between its reads of `TIME` (one a second, not \
         counted here); at replay times; and when the script reads `TIME` itself (before the \
         server's first read, or when its reads have failed for 10 s).\n"
    )?;
    writeln!(
        out,
        "| algorithm | state | bytes per key | Redis commands per decision | replay | script reads TIME |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|")?;
    for algorithm in Algorithm::ALL {
        let limit: Limit = serde_json::from_str(&match algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => {
                format!(r#"{{"algorithm":"{algorithm}","limit":1000,"window":"1m"}}"#)
            }
            _ => format!(r#"{{"algorithm":"{algorithm}","rate":100,"per":"1s","burst":1000}}"#),
        })?;
        for step in 0..5 {
            decide(
                &mut c,
                &limit,
                &key(&limit),
                ScriptTime::Replay(NOW + step * 1000),
                1,
            )
            .await?;
        }
        let replayed =
            commands_per_decision(&mut c, &limit, |i| ScriptTime::Replay(NOW + i * 10_000)).await?;
        let redis_now = read_time_us(&mut c).await?;
        let carried =
            commands_per_decision(&mut c, &limit, |i| ScriptTime::Carried(redis_now + i * 10))
                .await?;
        let reading = commands_per_decision(&mut c, &limit, |_| ScriptTime::Redis).await?;
        let bytes = usage(&mut c, &key(&limit)).await?;
        let bytes = if algorithm == Algorithm::SlidingLog {
            format!("{bytes} (5 entries; see below)")
        } else {
            bytes.to_string()
        };
        writeln!(
            out,
            "| {algorithm} | {} | {bytes} | {carried:.1} | {replayed:.1} | {reading:.1} |",
            state_of(algorithm)
        )?;
    }
    // The buckets above refill every 10 ms, a whole number of microseconds, so their time is
    // stored as an integer. At 49 a second a unit takes 20408.16 us: the leftover ticks make the
    // value a string.
    let fractional: Limit =
        serde_json::from_str(r#"{"algorithm":"gcra","rate":49,"per":"1s","burst":1000}"#)?;
    let fractional_key = key(&fractional);
    for step in 0..5 {
        decide(
            &mut c,
            &fractional,
            &fractional_key,
            ScriptTime::Replay(NOW + step * 1000),
            1,
        )
        .await?;
    }
    let bytes = usage(&mut c, &fractional_key).await?;
    let value: String = redis::cmd("GET")
        .arg(&fractional_key)
        .query_async(&mut c)
        .await?;
    writeln!(
        out,
        "\nThe buckets above refill every 10 ms, a whole number of microseconds, and store their time as an integer. \
         When `per / rate` is not a whole number of microseconds the leftover ticks are stored too \
         (gcra at 49 a second: `{value}`): {bytes} bytes per key."
    )?;

    writeln!(
        out,
        "\nsliding_log, by the number of entries (Redis converts a sorted set of more than 128 members from a listpack to a skiplist):\n"
    )?;
    writeln!(out, "| entries | bytes | bytes per entry | encoding |")?;
    writeln!(out, "|---|---|---|---|")?;
    let limit: Limit =
        serde_json::from_str(r#"{"algorithm":"sliding_log","limit":100000,"window":"1h"}"#)?;
    let log_key = format!("{}:growing", key(&limit));
    let mut entries = 0u64;
    for target in [1u64, 16, 64, 128, 129, 256, 1000, 10_000, 100_000] {
        while entries < target {
            let batch = (target - entries).min(1000);
            let at = ScriptTime::Replay(NOW + entries as i64);
            decide(&mut c, &limit, &log_key, at, batch).await?;
            entries += batch;
        }
        let bytes = usage(&mut c, &log_key).await?;
        let encoding: String = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(&log_key)
            .query_async(&mut c)
            .await?;
        writeln!(
            out,
            "| {entries} | {bytes} | {:.1} | {encoding} |",
            bytes as f64 / entries as f64
        )?;
    }
    Ok(out)
}
