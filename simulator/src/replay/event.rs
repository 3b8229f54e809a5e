//! What the replay's loop runs: a request's arrival, a callout's answer, a worker's tick, a
//! stream's idle timeout.

use tokio::task::JoinHandle;

use crate::transport::Delivered;

/// A callout's answer: still on its way (virtual time waits for it), or here (real time).
pub(super) enum Answer {
    Pending(JoinHandle<Delivered>),
    /// On its way, but Envoy's timeout comes first (virtual time): the service still decides
    /// the callout, and the module is given a 504.
    TimedOut(JoinHandle<Delivered>),
    Ready(Delivered),
}

pub(super) enum Event {
    Arrival(usize),
    Callout {
        instance: usize,
        worker: usize,
        token: u32,
        answer: Answer,
    },
    Tick {
        instance: usize,
        worker: usize,
        generation: u64,
    },
    IdleTimeout {
        instance: usize,
        worker: usize,
        context: u32,
    },
}

/// Arrivals first among events of one instant.
pub(super) const ARRIVAL: u8 = 0;
pub(super) const LATER: u8 = 1;
