//! Calls that share a limit key go to the server in the order they were made; calls on other
//! keys go side by side. Redis then sees each key's checks in trace order however the
//! connections race, and a replay is deterministic without being sequential.

use std::collections::HashMap;

use futures::FutureExt;
use futures::future::Shared;
use tokio::sync::oneshot;

/// Resolves when a call is answered (or dropped).
pub(crate) type Done = Shared<oneshot::Receiver<()>>;

/// Which earlier calls each new call waits for.
#[derive(Default)]
pub(crate) struct KeyOrder {
    /// The last call on each key, by the key's hash: two keys that happen to collide only make
    /// a call wait when it need not.
    last_by_key: HashMap<u64, Done>,
    /// The last call whose keys are unknown, which every later call waits for.
    last_unkeyed: Option<Done>,
    entered: u64,
}

impl KeyOrder {
    /// Enters a call on `keys` (hashes), or on keys unknown (`None`: it might touch any, so it
    /// waits for every call before it and every call after waits for it). Answers what the
    /// call must wait for, and the sender to drop or fire when it is answered.
    pub fn enter(&mut self, keys: Option<&[u64]>) -> (Vec<Done>, oneshot::Sender<()>) {
        let (done_tx, done_rx) = oneshot::channel::<()>();
        let done = done_rx.shared();
        let mut waits: Vec<Done> = self.last_unkeyed.iter().cloned().collect();
        match keys {
            Some(keys) => {
                for key in keys {
                    if let Some(previous) = self.last_by_key.insert(*key, done.clone()) {
                        waits.push(previous);
                    }
                }
            }
            None => {
                waits.extend(self.last_by_key.drain().map(|(_, d)| d));
                self.last_unkeyed = Some(done);
            }
        }
        self.entered += 1;
        if self.entered.is_multiple_of(4096) {
            self.last_by_key.retain(|_, d| d.peek().is_none());
        }
        (waits, done_tx)
    }
}
