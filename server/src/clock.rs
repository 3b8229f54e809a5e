//! Redis' clock, read by the server once a second rather than by every script call.
//!
//! Every replica must decide on one clock, and Redis' is the one they share (on a Cluster, one
//! node's: [`Store::time_us`](crate::store::Store::time_us)). A script that
//! reads `TIME` itself spends a command on it in every decision; instead the server reads
//! `TIME` every [`READ_EVERY`] and carries it forward on its own monotonic clock between reads,
//! passing the time to each script ([`ScriptTime::Carried`]). When no read has succeeded for
//! [`TRUST_FOR`], scripts read `TIME` again.
//!
//! Redis read its clock somewhere between the read's sending and its answer, so a read is
//! off by at most half its round trip, and by the two clocks' drift as it ages. A read that
//! waited behind a Redis stall (a fork, a slow script) or a queue of calls is off by half of
//! that wait, which can be tens of milliseconds: the carried time is taken from the read whose
//! bound is smallest now, so one slow read does not move it. What a difference of clocks does
//! to a decision is in docs/algorithms.md ("Time comes from Redis' clock").
//!
//! [`ScriptTime::Carried`]: crate::scripts::ScriptTime::Carried
//!
//! The server's own monotonic clock is read here too, and nowhere else ([`monotonic`]; the
//! lint `clippy::disallowed_methods` holds every other module to it).

// The one module that reads the process' clocks.
#![allow(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::scripts::ScriptTime;

/// This process' monotonic clock: what the server times for itself (timeouts, latency, how
/// long since a warning, when a connection went quiet). Limits are decided in Redis' time.
pub fn monotonic() -> Instant {
    Instant::now()
}

/// How often the server reads Redis' `TIME`.
pub const READ_EVERY: Duration = Duration::from_secs(1);
/// How long the carried time is trusted when no read succeeds.
pub const TRUST_FOR: Duration = Duration::from_secs(10);
/// How fast this process' monotonic clock and Redis' may drift apart, in parts per million:
/// two quartz clocks within 50 ppm each, as common crystals are.
pub const DRIFT_PPM: i64 = 100;

/// Redis' clock as read, carried forward on this process' monotonic clock.
#[derive(Debug)]
pub struct RedisClock {
    origin: Instant,
    /// Redis' time minus our monotonic time, in microseconds, by the kept read; meaningful
    /// once `answered_at_us` is set.
    offset_us: AtomicI64,
    /// Our monotonic time of the last answered read, in microseconds since `origin`; `NEVER`
    /// before the first.
    answered_at_us: AtomicI64,
    /// The read `offset_us` comes from. Only the reading task writes it, once a read.
    kept: Mutex<Option<Reading>>,
}

const NEVER: i64 = i64::MIN;

/// One read of Redis' `TIME`, on our monotonic clock.
#[derive(Debug, Clone, Copy)]
struct Reading {
    /// Redis' time minus ours.
    offset_us: i64,
    /// Our time halfway through the read, when Redis most likely read its clock.
    midpoint_us: i64,
    /// Half the read's round trip: how far Redis' reading may be from the midpoint.
    half_trip_us: i64,
}

impl Reading {
    /// How far the time this read carries may be from Redis' at our time `now_us`.
    fn bound_us(&self, now_us: i64) -> i64 {
        let age = now_us.saturating_sub(self.midpoint_us).max(0);
        // Rounded up: it is a bound.
        let drift = age.saturating_mul(DRIFT_PPM).saturating_add(999_999) / 1_000_000;
        self.half_trip_us.saturating_add(drift)
    }
}

impl Default for RedisClock {
    fn default() -> Self {
        RedisClock {
            origin: Instant::now(),
            offset_us: AtomicI64::new(0),
            answered_at_us: AtomicI64::new(NEVER),
            kept: Mutex::new(None),
        }
    }
}

/// Where the clock reads Redis' time: the [`Store`](crate::store::Store), or a stand-in in
/// tests.
pub trait TimeSource: Send + Sync + 'static {
    /// Why a read failed.
    type Error: std::fmt::Display;

    /// Redis' clock, in microseconds since the epoch.
    fn time_us(self: &Arc<Self>) -> impl Future<Output = Result<i64, Self::Error>> + Send;
}

impl RedisClock {
    fn local_us(&self, at: Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.origin).as_micros()).unwrap_or(i64::MAX)
    }

    /// Records a read of Redis' `TIME` (`redis_us`) asked at `sent` and answered at
    /// `received`. The carried time follows it unless the read kept so far is still the
    /// closer to Redis' clock.
    pub fn record(&self, redis_us: i64, sent: Instant, received: Instant) {
        let (sent, received) = (self.local_us(sent), self.local_us(received));
        let midpoint_us = sent + (received - sent) / 2;
        let reading = Reading {
            offset_us: redis_us - midpoint_us,
            midpoint_us,
            half_trip_us: (received - sent + 1) / 2,
        };
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.is_none_or(|k| reading.bound_us(received) <= k.bound_us(received)) {
            *kept = Some(reading);
            self.offset_us.store(reading.offset_us, Ordering::Relaxed);
        }
        self.answered_at_us.store(received, Ordering::Release);
    }

    /// Redis' time now, as carried; `None` before the first read or when the last answered
    /// read is older than [`TRUST_FOR`].
    pub fn now_us(&self, now: Instant) -> Option<i64> {
        let answered_at = self.answered_at_us.load(Ordering::Acquire);
        let local = self.local_us(now);
        let trusted = i64::try_from(TRUST_FOR.as_micros()).unwrap_or(i64::MAX);
        if answered_at == NEVER || local.saturating_sub(answered_at) > trusted {
            return None;
        }
        Some(local + self.offset_us.load(Ordering::Relaxed))
    }

    /// How far the time scripts are given may be from Redis' clock now, in microseconds: the
    /// kept read's bound while the carried time is trusted, and 0 while scripts read `TIME`.
    pub fn uncertainty_us(&self, now: Instant) -> i64 {
        if self.now_us(now).is_none() {
            return 0;
        }
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.map_or(0, |k| k.bound_us(self.local_us(now)))
    }

    /// The time a script call takes now: the carried clock while it is trusted, or else
    /// Redis' `TIME` read by the script.
    pub fn script_time(&self) -> ScriptTime {
        self.now_us(Instant::now())
            .map_or(ScriptTime::Redis, ScriptTime::Carried)
    }

    /// Reads Redis' `TIME` once and records it.
    pub async fn read<S: TimeSource>(&self, source: &Arc<S>) {
        let sent = Instant::now();
        match source.time_us().await {
            Ok(redis_us) => self.record(redis_us, sent, Instant::now()),
            // Not yet connected, or Redis away: calls fail on their own and say so.
            Err(e) => tracing::debug!(error = %e, "reading redis TIME failed"),
        }
    }

    /// Reads `TIME` every [`READ_EVERY`] until the source is dropped.
    pub fn keep_reading<S: TimeSource>(self: &Arc<Self>, source: Weak<S>) {
        let clock = Arc::clone(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(READ_EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(source) = source.upgrade() else {
                    return;
                };
                clock.read(&source).await;
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

    /// Redis' clock in these tests: exactly 3 s ahead of ours.
    fn redis_at(clock: &RedisClock, at: Instant) -> i64 {
        3_000_000 + clock.local_us(at)
    }

    #[test]
    fn a_read_slowed_by_a_stall_does_not_move_the_carried_time() {
        let clock = RedisClock::default();
        let t0 = clock.origin + Duration::from_secs(1);
        // A quick read: 200 µs there and back.
        let quick = t0 + Duration::from_micros(200);
        clock.record(redis_at(&clock, t0 + Duration::from_micros(50)), t0, quick);
        // A second later a read waits 80 ms behind a stall, and Redis reads its clock at the
        // end of it: taken at its midpoint, the carried time would run 40 ms ahead.
        let asked = t0 + Duration::from_secs(1);
        let answered = asked + Duration::from_millis(80);
        clock.record(redis_at(&clock, answered), asked, answered);
        let error = clock.now_us(answered).unwrap() - redis_at(&clock, answered);
        // The quick read's bound: half of 200 µs, plus 100 ppm of the 1.0799 s since, rounded up.
        assert_eq!(clock.uncertainty_us(answered), 208);
        assert!(error.abs() <= 208, "carried time off by {error} µs");
    }

    #[test]
    fn slower_reads_take_over_once_the_kept_one_has_aged_past_them() {
        let clock = RedisClock::default();
        let t0 = clock.origin + Duration::from_secs(1);
        clock.record(redis_at(&clock, t0), t0, t0);
        // Then reads of 2 ms there and back, each a second apart, at whose end Redis reads
        // its clock: they carry a time 1 ms ahead, with a bound of 1 ms.
        for second in 1..=12 {
            let asked = t0 + Duration::from_secs(second);
            let answered = asked + Duration::from_millis(2);
            clock.record(redis_at(&clock, answered), asked, answered);
            let error = clock.now_us(answered).unwrap() - redis_at(&clock, answered);
            // The first read's bound reaches 1 ms after 10 s of drift.
            let expected = if second < 10 { 0 } else { 1_000 };
            assert_eq!(error, expected, "after {second} s");
            assert!(
                error <= clock.uncertainty_us(answered),
                "after {second} s: off by more than the bound said"
            );
        }
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

    /// Redis' time in these tests, or a failure.
    struct FixedTime(Result<i64, &'static str>);

    impl TimeSource for FixedTime {
        type Error = &'static str;

        async fn time_us(self: &Arc<Self>) -> Result<i64, &'static str> {
            self.0
        }
    }

    #[tokio::test]
    async fn a_read_from_the_source_sets_the_clock_and_a_failed_one_does_not() {
        let clock = RedisClock::default();
        clock.read(&Arc::new(FixedTime(Err("redis away")))).await;
        assert_eq!(clock.now_us(Instant::now()), None);
        clock.read(&Arc::new(FixedTime(Ok(7_000_000)))).await;
        let now = clock.now_us(Instant::now()).expect("read");
        assert!((7_000_000..7_100_000).contains(&now), "{now}");
    }
}
