//! The most one call can make Redis do and store: a request's cost is one weighted entry of a
//! sliding log, not `cost` entries, so the costliest request the wire allows takes
//! milliseconds and kilobytes, and other callers never notice it (docs/redis.md, "Worst case
//! per call").

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::{Http, server, usec, used_memory};
use sluice_harness::RedisServer;
use sluice_server::store::Topology;

/// The wire's largest sliding log, and its longest window.
const HUGE_LOG: &str = r#"{"algorithm":"sliding_log","limit":100000,"window":"30d"}"#;

/// Decisions on other keys, as fast as one connection goes, until told to stop: how many
/// were answered, and how many were not 200.
struct Probe {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Probe {
    fn start(url: String) -> Probe {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let (stop, answered, failed) = (stop.clone(), answered.clone(), failed.clone());
            async move {
                let http = Http::http1();
                let limit = r#"{"algorithm":"gcra","rate":1000,"per":"1s","burst":1000}"#;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let body = common::one_check("probe", &format!("k{}", i % 50), limit);
                    let answer = http.decide(&url, &body, &[]).await;
                    answered.fetch_add(1, Ordering::Relaxed);
                    if answer.status != 200 {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
            }
        });
        Probe {
            stop,
            answered,
            failed,
            task,
        }
    }

    /// Stops it: (answered, failed).
    async fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        (
            self.answered.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

/// Runs `call` beside a probe: what Redis spent in scripts, and grew by, for it.
async fn measured<F: Future<Output = ()>>(redis: &RedisServer, url: &str, call: F) -> (u64, i64) {
    let probe = Probe::start(url.to_owned());
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let probed = usec(redis, "fcall");
    let memory = used_memory(redis) as i64;
    // The probe's own scripts count in `spent` too: tens of microseconds each.
    let answered_before = probe.answered.load(Ordering::Relaxed);
    call.await;
    let spent = usec(redis, "fcall") - probed;
    let grown = used_memory(redis) as i64 - memory;
    let answered_during = probe.answered.load(Ordering::Relaxed) - answered_before;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let (answered, failed) = probe.stop().await;
    assert!(answered > 0, "the probe never got an answer");
    assert_eq!(failed, 0, "{failed} of {answered} probe decisions failed");
    eprintln!(
        "worst case: Redis ran scripts {spent} µs and grew {grown} bytes while the probe had {answered_during} decisions answered"
    );
    (spent, grown)
}

/// What `MEMORY USAGE` says `key` takes.
fn key_bytes(redis: &RedisServer, key: &str) -> u64 {
    let bytes = redis
        .cli(&["MEMORY", "USAGE", key, "SAMPLES", "0"])
        .unwrap();
    bytes
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{key}: {bytes}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_costliest_decision_takes_milliseconds_and_kilobytes() {
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |_| {}).await;
    let http = Http::http1();
    // The adversarial run's request: 16 checks, each the whole of a sliding log of 100,000.
    let checks: Vec<String> = (0..16)
        .map(|i| format!(r#"{{"rule":"flood","key":"k{i}","limit":{HUGE_LOG},"cost":100000}}"#))
        .collect();
    let body = format!(r#"{{"checks":[{}]}}"#, checks.join(","));
    assert!(body.len() < 2_200, "{} bytes", body.len());
    let url = server.url();
    let (spent, grown) = measured(&redis, &url, async {
        let answer = http.decide(&url, &body, &[]).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        let results = answer.json()["results"].as_array().unwrap().clone();
        assert!(results.iter().all(|r| r["allowed"] == true), "{results:?}");
    })
    .await;
    // 2.6 s and 204 MB when each unit was an entry.
    assert!(spent < 50_000, "Redis ran scripts for {spent} µs");
    assert!(grown < 1_000_000, "Redis grew by {grown} bytes");
    let mut stored = 0;
    for i in 0..16 {
        let key = common::state_key("flood", &format!("k{i}"), HUGE_LOG);
        assert_eq!(redis.cli(&["ZCARD", &key]).unwrap().trim(), "1", "{key}");
        stored += key_bytes(&redis, &key);
    }
    eprintln!("worst case: the 16 keys hold {stored} bytes");
    assert!(stored < 16 * 512, "{stored} bytes");
    // And the log still counts every unit: the next unit is denied for the whole window.
    let next = http
        .decide(&url, &common::one_check("flood", "k0", HUGE_LOG), &[])
        .await;
    assert_eq!(next.json()["results"][0]["allowed"], false, "{}", next.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_costliest_lease_takes_milliseconds_and_kilobytes() {
    let redis = RedisServer::start().unwrap();
    let server = server(Topology::Standalone(redis.url()), |_| {}).await;
    let http = Http::http1();
    // The adversarial run's 13 KB lease: 64 asks, each for a whole sliding log of 100,000.
    let asks: Vec<String> = (0..64)
        .map(|i| {
            format!(
                r#"{{"rule":"flood","key":"k{i}","limit":{HUGE_LOG},"terms":{{"max_units":100000,"max_outstanding":100000,"ttl":"1m"}},"want":100000}}"#
            )
        })
        .collect();
    let body = format!(r#"{{"holder":"h","asks":[{}]}}"#, asks.join(","));
    let url = server.url();
    let (spent, grown) = measured(&redis, &url, async {
        let answer = http
            .send(
                "POST",
                &format!("{url}/v1/lease"),
                &[("content-type", "application/json")],
                body.clone(),
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        let grants = answer.json()["grants"].as_array().unwrap().clone();
        assert!(grants.iter().all(|g| g["granted"] == 100000), "{grants:?}");
    })
    .await;
    // 10.25 s and 775 MB when each unit was an entry.
    assert!(spent < 50_000, "Redis ran scripts for {spent} µs");
    assert!(grown < 1_000_000, "Redis grew by {grown} bytes");
    let stored: u64 = (0..64)
        .map(|i| {
            let key = common::state_key("flood", &format!("k{i}"), HUGE_LOG);
            key_bytes(&redis, &key) + key_bytes(&redis, &sluice_core::key::ledger_key(&key))
        })
        .sum();
    eprintln!("worst case: the 64 keys and their ledgers hold {stored} bytes");
    assert!(stored < 64 * 1024, "{stored} bytes");
}
