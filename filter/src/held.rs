//! Requests held back by a shaping leaky bucket, released by the root context's tick.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;

use crate::ffi;
use crate::ticker::Ticker;

/// The held requests of one VM: (release time in ms, stream context id).
pub struct Held {
    queue: BTreeSet<(u64, u32)>,
    ticker: Rc<Ticker>,
}

/// Shared by the root context and its streams (one VM is one thread).
pub type SharedHeld = Rc<RefCell<Held>>;

impl Held {
    /// Nothing held yet; the tick is asked for through `ticker`.
    pub fn new(ticker: Rc<Ticker>) -> Held {
        Held {
            queue: BTreeSet::new(),
            ticker,
        }
    }

    /// Holds stream `context_id` until `release_at_ms`, starting the tick if it was idle.
    pub fn hold(&mut self, context_id: u32, release_at_ms: u64) {
        if self.queue.is_empty() {
            self.ticker.set_holding(true);
        }
        self.queue.insert((release_at_ms, context_id));
    }

    /// Forgets stream `context_id`, held until `release_at_ms`, if it ended while held.
    pub fn forget(&mut self, context_id: u32, release_at_ms: u64) {
        self.queue.remove(&(release_at_ms, context_id));
    }

    /// Resumes every stream due at `now_ms`; stops the tick when none is left.
    pub fn release_due(&mut self, now_ms: u64) {
        while let Some(&(at, id)) = self.queue.first() {
            if at > now_ms {
                break;
            }
            self.queue.pop_first();
            if ffi::set_effective_context(id) {
                let _ = ffi::resume_request();
            }
        }
        if self.queue.is_empty() {
            self.ticker.set_holding(false);
        }
    }
}
