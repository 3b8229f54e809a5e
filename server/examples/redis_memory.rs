//! Measures Redis memory per key for each algorithm with `MEMORY USAGE`, on a redis-server it
//! starts, and prints a Markdown table (used by `docs/algorithms.md` and `make bench`).
//!
//! `cargo run --release -p sluice-server --example redis_memory`

#![allow(clippy::expect_used, clippy::unwrap_used)] // a measuring tool: any failure is fatal

use redis::aio::MultiplexedConnection;
use sluice_core::limit::{Algorithm, Limit};
use sluice_harness::RedisServer;
use sluice_server::scripts::ScriptCall;

async fn decide(c: &mut MultiplexedConnection, limit: &Limit, key: &str, now: i64, cost: u64) {
    let call = ScriptCall::new(limit, key.to_owned(), Some(now), cost, false);
    let mut invocation = call.script().prepare_invoke();
    invocation.key(&call.key);
    for arg in &call.args {
        invocation.arg(arg);
    }
    let _: Vec<i64> = invocation.invoke_async(c).await.unwrap();
}

async fn usage(c: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(c)
        .await
        .unwrap()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let redis = RedisServer::start().unwrap();
    let mut c = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let version: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut c)
        .await
        .unwrap();
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    let now = 1_763_700_000_000_000;
    // A realistic key: prefix, hash tag with rule and client address, algorithm.
    let key = |a: Algorithm| format!("sluice:{{per-client:203.0.113.77}}:{a}");

    println!(
        "Redis {version}, `MEMORY USAGE <key> SAMPLES 0`, key `sluice:{{per-client:203.0.113.77}}:<algorithm>`\n"
    );
    println!("| algorithm | state | bytes per key |");
    println!("|---|---|---|");
    for algorithm in Algorithm::ALL {
        if algorithm == Algorithm::SlidingLog {
            continue;
        }
        let limit: Limit = serde_json::from_str(&match algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                format!(r#"{{"algorithm":"{algorithm}","limit":1000,"window":"1m"}}"#)
            }
            _ => format!(r#"{{"algorithm":"{algorithm}","rate":100,"per":"1s","burst":1000}}"#),
        })
        .unwrap();
        for step in 0..5 {
            decide(&mut c, &limit, &key(algorithm), now + step * 1000, 1).await;
        }
        let state = match algorithm {
            Algorithm::FixedWindow => "hash {w, n}",
            Algorithm::SlidingWindow => "hash {w, cur, prev}",
            Algorithm::TokenBucket => "hash {tokens, ts}",
            Algorithm::LeakyBucket => "hash {level, ts}",
            _ => "string (the TAT)",
        };
        println!(
            "| {algorithm} | {state} | {} |",
            usage(&mut c, &key(algorithm)).await
        );
    }

    println!("\nsliding_log: a sorted set, one member per admitted request\n");
    println!("| entries | bytes | bytes per entry | encoding |");
    println!("|---|---|---|---|");
    let limit: Limit =
        serde_json::from_str(r#"{"algorithm":"sliding_log","limit":100000,"window":"1h"}"#)
            .unwrap();
    let log_key = key(Algorithm::SlidingLog);
    let mut entries = 0u64;
    for target in [1u64, 16, 64, 127, 128, 129, 256, 1000, 10_000, 100_000] {
        while entries < target {
            let batch = (target - entries).min(1000);
            decide(&mut c, &limit, &log_key, now + entries as i64, batch).await;
            entries += batch;
        }
        let bytes = usage(&mut c, &log_key).await;
        let encoding: String = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(&log_key)
            .query_async(&mut c)
            .await
            .unwrap();
        println!(
            "| {entries} | {bytes} | {:.1} | {encoding} |",
            bytes as f64 / entries as f64
        );
    }
}
