//! Real time: wall time mapped onto trace time, answers coming back as they arrive, and the
//! wait for an answer that spins before it sleeps.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::transport::Delivered;

/// Waits for a callout's answer by polling Redis' socket without sleeping, for a while, before
/// parking. The answer is tens of microseconds away; sleeping in `epoll_wait` and being woken
/// by Redis costs both processes a cross-core wake-up on every callout. Each round also offers
/// the CPU to whatever else is ready to run on it (Redis itself, when the two share a core).
pub(super) async fn spin_until_done<T>(handle: JoinHandle<T>) -> Result<T, tokio::task::JoinError> {
    const SPIN: Duration = Duration::from_micros(500);
    let started = crate::replay::clock::wall_now();
    while !handle.is_finished() && started.elapsed() < SPIN {
        std::thread::yield_now();
        tokio::task::yield_now().await;
    }
    handle.await
}

/// A callout answered in real time, on its way back to the loop.
pub(super) struct Answered {
    pub(super) instance: usize,
    pub(super) worker: usize,
    pub(super) token: u32,
    pub(super) delivered: Delivered,
}

/// The real-time clock: wall time mapped onto trace time.
pub(super) struct Pace {
    pub(super) speed: f64,
    pub(super) wall_start: Instant,
    pub(super) trace_start_ns: u64,
    pub(super) answers_tx: mpsc::UnboundedSender<Answered>,
    pub(super) answers_rx: mpsc::UnboundedReceiver<Answered>,
    pub(super) in_flight: usize,
}

impl Pace {
    pub(super) fn trace_now(&self) -> u64 {
        self.trace_start_ns + (self.wall_start.elapsed().as_nanos() as f64 * self.speed) as u64
    }

    pub(super) fn wall_at(&self, trace_ns: u64) -> Instant {
        let behind = trace_ns.saturating_sub(self.trace_start_ns) as f64 / self.speed;
        self.wall_start + Duration::from_nanos(behind as u64)
    }
}
