//! The order in which all streams' fundings go to Redis: earliest deadline first.
//!
//! Each stream funds its own buckets, but Redis serves them all. Left to themselves, streams
//! that start together share Redis evenly, so that each stream's first report is funded only
//! as all of theirs are: four Envoys' first reports of 50,000 buckets, a quarter of a second
//! apart, each had every bucket assigned only after nearly all 200,000 were funded (2.4 to 3.5
//! s after its report), and the first stream's refills, a second on, came between. A first
//! funding that waits leaves its Envoy on its `no_assignment_behavior`; a refill that waits
//! leaves it on the assignment it has. So the lane lets a few calls into Redis at a time and
//! lets in the one whose deadline is earliest: a first funding's is its report, a refill's
//! its tick and the early side ticks fund refills on (`REFILL_EARLY_MS`, when it falls due). A
//! stream that reports after another is served after it, and a refill gives way to the first
//! fundings of reports up to that slack after its tick, and to none later, however many
//! streams open: neither kind starves the other.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use tokio::sync::oneshot;

/// A place in Redis' queue: a lease call may be sent while it is held. Dropped, it goes to
/// the earliest waiter.
#[derive(Debug)]
pub struct Pass {
    lane: Arc<FundingLane>,
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.lane.queue().hand_on();
    }
}

/// The calls waiting for a place, and how many places are free.
#[derive(Debug, Default)]
struct Queue {
    free: usize,
    /// By deadline, then by arrival: each waiter's channel for its place.
    waiting: BTreeMap<(Instant, u64), oneshot::Sender<()>>,
    arrivals: u64,
}

impl Queue {
    /// A place in the queue for a call due by `deadline`.
    fn wait(&mut self, deadline: Instant) -> oneshot::Receiver<()> {
        let (sender, place) = oneshot::channel();
        self.arrivals += 1;
        self.waiting.insert((deadline, self.arrivals), sender);
        place
    }

    /// Hands a place to the earliest waiter still waiting, or frees it.
    fn hand_on(&mut self) {
        while let Some((_, sender)) = self.waiting.pop_first() {
            if sender.send(()).is_ok() {
                return;
            }
        }
        self.free += 1;
    }
}

/// The server's lane into Redis for quota fundings.
#[derive(Debug)]
pub struct FundingLane {
    queue: Mutex<Queue>,
}

impl FundingLane {
    /// A lane that lets `calls` lease calls into Redis at once.
    pub fn new(calls: usize) -> FundingLane {
        FundingLane {
            queue: Mutex::new(Queue {
                free: calls.max(1),
                ..Queue::default()
            }),
        }
    }

    /// Waits for a place for a call due by `deadline`. Dropping the future gives up the place
    /// asked for, or the place it was given.
    pub async fn enter(self: Arc<FundingLane>, deadline: Instant) -> Pass {
        let place = {
            let mut queue = self.queue();
            if queue.free > 0 {
                queue.free -= 1;
                drop(queue);
                return Pass { lane: self };
            }
            queue.wait(deadline)
        };
        FundingLane::take(self, place).await
    }

    /// Waits until `place` is given.
    async fn take(lane: Arc<FundingLane>, place: oneshot::Receiver<()>) -> Pass {
        let mut waiter = Waiter {
            lane,
            place,
            taken: false,
        };
        // A sender is dropped unsent only once its receiver is gone: this one is here.
        let _ = (&mut waiter.place).await;
        waiter.taken = true;
        Pass {
            lane: Arc::clone(&waiter.lane),
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        // Nothing a holder does can leave the queue half changed: a poisoned lock's queue
        // is whole.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A call waiting in the lane: dropped after it was given a place but before it took it, it
/// hands that place on.
struct Waiter {
    lane: Arc<FundingLane>,
    place: oneshot::Receiver<()>,
    taken: bool,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if !self.taken {
            // Closing first settles the race with a sender: after it, a place is either here
            // or was never sent.
            self.place.close();
            if self.place.try_recv().is_ok() {
                self.lane.queue().hand_on();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::monotonic;

    fn at(base: Instant, s: u64) -> Instant {
        base + Duration::from_secs(s)
    }

    /// Waiters for `deadlines` (seconds after `base`), asked for in that order, each sending
    /// its deadline on the receiver returned once it has a place, then giving the place back.
    fn waiters(
        lane: &Arc<FundingLane>,
        base: Instant,
        deadlines: &[u64],
    ) -> (
        Vec<tokio::task::JoinHandle<()>>,
        tokio::sync::mpsc::UnboundedReceiver<u64>,
    ) {
        let (order_tx, order) = tokio::sync::mpsc::unbounded_channel();
        let tasks = deadlines
            .iter()
            .map(|&s| {
                let lane = Arc::clone(lane);
                let order_tx = order_tx.clone();
                tokio::spawn(async move {
                    let _pass = lane.enter(at(base, s)).await;
                    let _ = order_tx.send(s);
                })
            })
            .collect();
        (tasks, order)
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn places_go_to_the_earliest_deadline_not_the_first_to_ask() {
        let lane = Arc::new(FundingLane::new(1));
        let held = Arc::clone(&lane).enter(monotonic()).await;
        let (tasks, mut order) = waiters(&lane, monotonic(), &[3, 1, 2]);
        settle().await;
        drop(held);
        for task in tasks {
            task.await.unwrap();
        }
        let got: Vec<u64> = std::iter::from_fn(|| order.try_recv().ok()).collect();
        assert_eq!(got, [1, 2, 3]);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_leaves_its_place_to_the_next() {
        let lane = Arc::new(FundingLane::new(1));
        let base = monotonic();
        let held = Arc::clone(&lane).enter(base).await;
        let (gives_up, _) = waiters(&lane, base, &[1]);
        let (later, _) = waiters(&lane, base, &[2]);
        settle().await;
        gives_up[0].abort();
        drop(held);
        for task in later {
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .expect("the later waiter got the place")
                .unwrap();
        }
        // And the place came back: one more enters at once.
        let _again = tokio::time::timeout(Duration::from_secs(5), lane.enter(base))
            .await
            .expect("the place was freed");
    }

    #[tokio::test]
    async fn places_are_limited_to_the_lanes_width() {
        let lane = Arc::new(FundingLane::new(2));
        let _a = Arc::clone(&lane).enter(monotonic()).await;
        let _b = Arc::clone(&lane).enter(monotonic()).await;
        let third = tokio::time::timeout(Duration::from_millis(50), lane.enter(monotonic()));
        assert!(third.await.is_err(), "a third call entered a lane of two");
    }
}
