//! The local cache of over-limit counters, as the reference service keeps one
//! (`LOCAL_CACHE_SIZE_IN_BYTES`): a descriptor's counter that Redis found over its limit is
//! answered over the limit, without Redis, until it could admit again.
//!
//! The reference remembers a counter for the whole of its unit. sluice remembers it until the
//! verdict's `retry_after`, for requests that ask at least as many hits: by then the counter
//! may admit again, and before then no request of that cost could pass, since other traffic
//! only takes more. So the cache saves Redis calls without ever changing a decision.

use std::collections::HashMap;
use std::sync::Mutex;

use sluice_core::deny_cache;
use sluice_core::verdict::Verdict;

/// Over-limit counters by [`sluice_core::rls::request::Planned::counter_id`].
#[derive(Debug)]
pub struct OverLimitCache {
    entries: Mutex<HashMap<String, Entry>>,
    capacity: usize,
}

#[derive(Debug, Clone)]
struct Entry {
    /// The hits the denied request asked; a request asking fewer may pass sooner.
    hits: u64,
    /// The denial, as the filters' deny caches remember one (milliseconds: a millisecond
    /// early at most, never late).
    denial: deny_cache::Entry,
}

/// `now_us` in whole milliseconds, rounded down.
fn ms(now_us: i64) -> u64 {
    u64::try_from(now_us / 1000).unwrap_or(0)
}

impl OverLimitCache {
    /// A cache of at most `capacity` counters; 0 turns it off.
    pub fn new(capacity: usize) -> OverLimitCache {
        OverLimitCache {
            entries: Mutex::new(HashMap::new()),
            capacity,
        }
    }

    /// The remembered denial of `counter` for a request asking `hits` at `now_us`, if any.
    pub fn get(&self, counter: &str, hits: u64, now_us: i64) -> Option<Verdict> {
        if self.capacity == 0 {
            return None;
        }
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let entry = entries.get(counter)?;
        let now_ms = ms(now_us);
        if hits < entry.hits || now_ms >= entry.denial.until_ms {
            return None;
        }
        Some(entry.denial.denial_at(now_ms))
    }

    /// Remembers Redis' denial of `counter` for `hits` at `now_us`. A denial no wait lifts (the
    /// hits exceed the limit's capacity) is not remembered: each such request asks Redis.
    pub fn remember(&self, counter: &str, hits: u64, verdict: &Verdict, now_us: i64) {
        if self.capacity == 0 {
            return;
        }
        let now_ms = ms(now_us);
        // Redis' verdict is the limit's own: no cap beyond it.
        let Some(denial) =
            deny_cache::Entry::of_denial(counter.to_owned(), verdict, now_ms, u64::MAX)
        else {
            return;
        };
        let entry = Entry { hits, denial };
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= self.capacity && !entries.contains_key(counter) {
            entries.retain(|_, e| e.denial.until_ms > now_ms);
            if entries.len() >= self.capacity {
                // Full of live denials: losing one costs a Redis call, never a wrong answer.
                if let Some(victim) = entries.keys().next().cloned() {
                    entries.remove(&victim);
                }
            }
        }
        entries.insert(counter.to_owned(), entry);
    }

    /// Forgets every counter (a new configuration may have new limits).
    pub fn clear(&self) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(retry_after_ms: Option<u64>) -> Verdict {
        Verdict {
            allowed: false,
            limit: 10,
            remaining: 0,
            reset_ms: 60_000,
            retry_after_ms,
            delay_ms: 0,
        }
    }

    #[test]
    fn a_denial_is_answered_until_its_retry_after_for_requests_asking_as_much_or_more() {
        let cache = OverLimitCache::new(16);
        cache.remember("d:k_v", 2, &denied(Some(5_000)), 1_000_000);
        let cached = cache.get("d:k_v", 2, 3_000_000).unwrap();
        assert_eq!(
            (cached.retry_after_ms, cached.reset_ms),
            (Some(3_000), 58_000)
        );
        assert!(cache.get("d:k_v", 5, 3_000_000).is_some());
        assert!(
            cache.get("d:k_v", 1, 3_000_000).is_none(),
            "fewer hits may pass sooner"
        );
        assert!(
            cache.get("d:k_v", 2, 6_000_000).is_none(),
            "past retry_after"
        );
        assert!(cache.get("d:other", 2, 3_000_000).is_none());
        cache.remember("d:never", 20, &denied(None), 1_000_000);
        assert!(
            cache.get("d:never", 20, 1_000_001).is_none(),
            "no wait admits it"
        );
    }

    #[test]
    fn a_full_cache_makes_room_and_a_zero_capacity_cache_remembers_nothing() {
        let cache = OverLimitCache::new(2);
        for (i, counter) in ["a", "b", "c"].iter().enumerate() {
            cache.remember(counter, 1, &denied(Some(1_000)), i64::try_from(i).unwrap());
        }
        let live = ["a", "b", "c"]
            .iter()
            .filter(|c| cache.get(c, 1, 10).is_some())
            .count();
        assert_eq!(live, 2);
        cache.clear();
        assert!(cache.get("c", 1, 10).is_none());
        let off = OverLimitCache::new(0);
        off.remember("a", 1, &denied(Some(1_000)), 0);
        assert!(off.get("a", 1, 1).is_none());
    }
}
