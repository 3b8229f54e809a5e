//! What the limit keys cost Redis: `MEMORY USAGE` of every key a replay left, by rule.
//!
//! Keys are `<prefix>:{<rule>:<key>}:<layout>` ([`sluice_core::key::redis_key`]), so one
//! `SCAN` of the prefix finds them all and the rule is read back from each name.

use std::collections::BTreeMap;

use sluice_server::store::redacted;

use crate::report::RuleMemory;

/// Keys measured per round trip.
const BATCH: usize = 500;

/// Measures every key under `prefix` in the Redis at `url`, by rule.
pub async fn measure(url: &str, prefix: &str) -> Result<BTreeMap<String, RuleMemory>, String> {
    let client =
        redis::Client::open(url).map_err(|e| format!("Redis URL {}: {e}", redacted(url)))?;
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("connecting to {}: {e}", redacted(url)))?;
    let pattern = format!("{prefix}:*");
    let mut keys: Vec<String> = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut connection)
            .await
            .map_err(|e| format!("SCAN: {e}"))?;
        keys.extend(batch);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    let mut by_rule: BTreeMap<String, RuleMemory> = BTreeMap::new();
    for chunk in keys.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for key in chunk {
            pipe.cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .arg("SAMPLES")
                .arg(0);
        }
        let sizes: Vec<Option<u64>> = pipe
            .query_async(&mut connection)
            .await
            .map_err(|e| format!("MEMORY USAGE: {e}"))?;
        for (key, size) in chunk.iter().zip(sizes) {
            // A key that expired between SCAN and MEMORY USAGE is gone: nothing to count.
            let (Some(rule), Some(size)) = (rule_of(key, prefix), size) else {
                continue;
            };
            let memory = by_rule.entry(rule.to_owned()).or_default();
            memory.keys += 1;
            memory.bytes += size;
            memory.max_bytes = memory.max_bytes.max(size);
        }
    }
    Ok(by_rule)
}

/// The rule a key belongs to.
fn rule_of<'a>(key: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = key.strip_prefix(prefix)?.strip_prefix(":{")?;
    rest.split(':').next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_is_read_back_from_the_key() {
        assert_eq!(rule_of("p:{per-ip:10.0.0.1}:gc", "p"), Some("per-ip"));
        assert_eq!(rule_of("other:{per-ip:x}:gc", "p"), None);
    }

    /// The reason lands in the replay's report, which is shared more widely than the URL.
    #[tokio::test]
    async fn a_redis_that_cannot_be_reached_is_named_without_its_password() {
        let port = sluice_harness::free_port().unwrap();
        let url = format!("redis://:hunter2@127.0.0.1:{port}");
        let why = measure(&url, "p").await.unwrap_err();
        assert!(why.contains(&format!("127.0.0.1:{port}")), "{why}");
        assert!(!why.contains("hunter2"), "{why}");
    }
}
