//! Busy polling: while Redis calls come and go, the server's thread keeps polling its sockets
//! instead of going to sleep between them (`--busy-poll-us`).
//!
//! A decision is a chain of hand-offs between processes: Envoy's request wakes the server, the
//! server's command wakes Redis, Redis' answer wakes the server, the server's answer wakes
//! Envoy. Each wake-up of a sleeping process costs its sender a cross-CPU interrupt and its
//! receiver a trip through the scheduler, tens of microseconds on a virtual machine, and a
//! closed loop of callers waits through every one of them: the server's rate is bound by those
//! waits more than by its CPU (BENCHMARKS.md, the server). While the server has Redis calls
//! starting and ending, the next event is microseconds away; polling for it, the server is
//! awake when it comes, and a sender finds it running.
//!
//! The poller is a task on the server's one thread ([`busy_poll`]): each time round it yields
//! to the runtime, which then polls its sockets without blocking and runs what they woke, and
//! to the operating system, so a process sharing the CPU (Redis, on a small machine) runs at
//! once. It goes on for as long as calls start or end within the budget of one another, and
//! then sleeps until the next call: an idle server spins at most one budget after its last
//! call. The price is CPU: the time between events is spent polling rather than sleeping.
//! It polls one thread's event loop, so it goes with `--threads 1`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::clock;

/// Redis calls starting and ending, which the poller watches. The store reports every call
/// ([`Activity::happened`]); until a poller watches, that costs a load of a flag that never
/// changes, not a write every thread's calls would contend on.
#[derive(Debug, Default)]
pub struct Activity {
    watched: AtomicBool,
    events: AtomicU64,
    poller_asleep: AtomicBool,
    wake: Notify,
}

impl Activity {
    /// A call started or ended: counted, and the poller woken if it sleeps.
    pub fn happened(&self) {
        if !self.watched.load(Ordering::Relaxed) {
            return;
        }
        self.events.fetch_add(1, Ordering::Relaxed);
        if self.poller_asleep.load(Ordering::Relaxed)
            && self.poller_asleep.swap(false, Ordering::Relaxed)
        {
            self.wake.notify_one();
        }
    }

    fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    /// Until a call after the `seen`th event. One that comes as the poller goes to sleep is
    /// either counted by then or finds it marked asleep and leaves a permit in `wake`.
    async fn after(&self, seen: u64) {
        self.poller_asleep.store(true, Ordering::Relaxed);
        if self.events() != seen {
            self.poller_asleep.store(false, Ordering::Relaxed);
            return;
        }
        self.wake.notified().await;
    }
}

/// One run of polling: whether to go on, given the events counted so far and the time.
#[derive(Debug, Clone, Copy)]
struct Spin {
    seen: u64,
    last_event: Instant,
    budget: Duration,
}

impl Spin {
    fn new(events: u64, now: Instant, budget: Duration) -> Spin {
        Spin {
            seen: events,
            last_event: now,
            budget,
        }
    }

    /// Whether to poll again: while an event came within `budget` of now.
    fn go_on(&mut self, events: u64, now: Instant) -> bool {
        if events != self.seen {
            self.seen = events;
            self.last_event = now;
        }
        now.saturating_duration_since(self.last_event) < self.budget
    }
}

/// Polls while `activity` goes on, each run until no call has started or ended for `budget`;
/// never returns. Each run's time is handed to `polled`.
pub async fn busy_poll(activity: Arc<Activity>, budget: Duration, polled: impl Fn(Duration)) {
    activity.watched.store(true, Ordering::Relaxed);
    let mut seen = activity.events();
    loop {
        activity.after(seen).await;
        let started = clock::monotonic();
        let mut spin = Spin::new(activity.events(), started, budget);
        loop {
            tokio::task::yield_now().await;
            std::thread::yield_now();
            if !spin.go_on(activity.events(), clock::monotonic()) {
                break;
            }
        }
        seen = spin.seen;
        polled(started.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_goes_on_while_events_come_within_the_budget_of_one_another() {
        let t0 = clock::monotonic();
        let at = |us: u64| t0 + Duration::from_micros(us);
        let mut spin = Spin::new(7, t0, Duration::from_micros(50));
        assert!(spin.go_on(7, at(10)));
        assert!(spin.go_on(7, at(49)));
        // An event 49 us after the last keeps it going another 50 from there.
        assert!(spin.go_on(8, at(49)));
        assert!(spin.go_on(8, at(98)));
        assert!(!spin.go_on(8, at(99)), "50 us without an event");
        assert!(
            spin.go_on(12, at(99)),
            "several events at once count as one"
        );
        assert!(!spin.go_on(12, at(149)));
    }

    #[tokio::test]
    async fn a_sleeping_poller_wakes_for_the_next_call_and_misses_none_as_it_goes_to_sleep() {
        let activity = Arc::new(Activity::default());
        activity.watched.store(true, Ordering::Relaxed);
        let sleeping = tokio::spawn({
            let activity = Arc::clone(&activity);
            async move { activity.after(0).await }
        });
        tokio::task::yield_now().await;
        assert!(!sleeping.is_finished(), "no call yet");
        activity.happened();
        tokio::time::timeout(Duration::from_secs(5), sleeping)
            .await
            .expect("woken by the call")
            .unwrap();
        // A call it has not seen, made before it went to sleep: it does not sleep at all.
        activity.happened();
        tokio::time::timeout(Duration::from_secs(5), activity.after(1))
            .await
            .expect("the call was counted");
    }
}
