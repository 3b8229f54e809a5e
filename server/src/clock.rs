//! Redis' clock, read by the server once a second rather than by every script call.
//!
//! Every replica must decide on one clock, and Redis' is the one they share. A script that
//! reads `TIME` itself spends a command on it in every decision; instead the server reads
//! `TIME` every [`READ_EVERY`] and carries it forward on its own monotonic clock between reads,
//! passing the time to each script ([`ScriptTime::Carried`]). The carried time differs from
//! Redis' by half the read's round trip plus the two clocks' drift since the read
//! (microseconds). What such a difference does to a decision is in docs/algorithms.md ("Whose
//! clock"). When no read has succeeded for [`TRUST_FOR`], scripts read `TIME` again.
//!
//! [`ScriptTime::Carried`]: crate::scripts::ScriptTime::Carried

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::scripts::ScriptTime;
use crate::store::Store;

/// How often the server reads Redis' `TIME`.
pub const READ_EVERY: Duration = Duration::from_secs(1);
/// How long a read is trusted when no newer one succeeds.
pub const TRUST_FOR: Duration = Duration::from_secs(10);

/// Redis' clock as last read, carried forward on this process' monotonic clock.
#[derive(Debug)]
pub struct RedisClock {
    origin: Instant,
    /// Redis' time minus our monotonic time, in microseconds; meaningful once `read_at_us`
    /// is set.
    offset_us: AtomicI64,
    /// Our monotonic time of the last read, in microseconds since `origin`; `NEVER` before
    /// the first.
    read_at_us: AtomicI64,
}

const NEVER: i64 = i64::MIN;

impl Default for RedisClock {
    fn default() -> Self {
        RedisClock {
            origin: Instant::now(),
            offset_us: AtomicI64::new(0),
            read_at_us: AtomicI64::new(NEVER),
        }
    }
}

/// Redis' clock by `TIME`, in microseconds since the epoch.
pub async fn read_time_us<C>(connection: &mut C) -> redis::RedisResult<i64>
where
    C: redis::aio::ConnectionLike + Send,
{
    let (seconds, micros): (i64, i64) = redis::cmd("TIME").query_async(connection).await?;
    Ok(seconds * 1_000_000 + micros)
}

impl RedisClock {
    fn local_us(&self, at: Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.origin).as_micros()).unwrap_or(i64::MAX)
    }

    /// Records a read of Redis' `TIME` (`redis_us`) asked at `sent` and answered at
    /// `received`: Redis read its clock, most likely, halfway between.
    pub fn record(&self, redis_us: i64, sent: Instant, received: Instant) {
        let midpoint = (self.local_us(sent) + self.local_us(received)) / 2;
        self.offset_us.store(redis_us - midpoint, Ordering::Relaxed);
        self.read_at_us
            .store(self.local_us(received), Ordering::Release);
    }

    /// Redis' time now, as carried since the last read; `None` before the first read or
    /// when the last is older than [`TRUST_FOR`].
    pub fn now_us(&self, now: Instant) -> Option<i64> {
        let read_at = self.read_at_us.load(Ordering::Acquire);
        let local = self.local_us(now);
        let trusted = i64::try_from(TRUST_FOR.as_micros()).unwrap_or(i64::MAX);
        if read_at == NEVER || local.saturating_sub(read_at) > trusted {
            return None;
        }
        Some(local + self.offset_us.load(Ordering::Relaxed))
    }

    /// The time a script call takes now: the carried clock while it is trusted, or else
    /// Redis' `TIME` read by the script.
    pub fn script_time(&self) -> ScriptTime {
        self.now_us(Instant::now())
            .map_or(ScriptTime::Redis, ScriptTime::Carried)
    }

    /// Reads `TIME` every [`READ_EVERY`] until the store is dropped.
    pub fn keep_reading(self: &Arc<Self>, store: Weak<Store>) {
        let clock = Arc::clone(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(READ_EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(store) = store.upgrade() else {
                    return;
                };
                let sent = Instant::now();
                match store.time_us().await {
                    Ok(redis_us) => clock.record(redis_us, sent, Instant::now()),
                    // Not yet connected, or Redis away: calls fail on their own and say so.
                    Err(e) => tracing::debug!(error = %e, "reading redis TIME failed"),
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carries_the_read_forward_on_the_monotonic_clock() {
        let clock = RedisClock::default();
        let sent = clock.origin + Duration::from_millis(100);
        assert_eq!(clock.now_us(sent), None, "nothing read yet");
        // Asked at 100 ms, answered at 100.4 ms: Redis read 5,000,000 at 100.2 ms.
        clock.record(5_000_000, sent, sent + Duration::from_micros(400));
        assert_eq!(
            clock.now_us(sent + Duration::from_micros(200)),
            Some(5_000_000)
        );
        assert_eq!(
            clock.now_us(sent + Duration::from_millis(1_000)),
            Some(5_000_000 + 999_800)
        );
    }

    #[test]
    fn an_old_read_is_not_trusted() {
        let clock = RedisClock::default();
        let at = clock.origin + Duration::from_millis(1);
        clock.record(7_000_000, at, at);
        assert_eq!(clock.now_us(at + TRUST_FOR), Some(7_000_000 + 10_000_000));
        assert_eq!(
            clock.now_us(at + TRUST_FOR + Duration::from_micros(1)),
            None
        );
    }
}
