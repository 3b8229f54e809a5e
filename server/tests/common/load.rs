//! Callers deciding in a loop, each on keys of its own, until stopped: the load the
//! resilience tests change Redis under.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use futures::future::join_all;
use tokio::task::JoinHandle;

use super::{Http, one_check};

/// One request of the load.
#[derive(Debug, Clone)]
pub struct Answered {
    /// When it was sent.
    pub sent: Instant,
    /// Its limit key.
    pub key: String,
    pub status: u16,
}

/// The callers, running.
pub struct Load {
    stop: Arc<AtomicBool>,
    callers: Vec<JoinHandle<Vec<Answered>>>,
}

impl Load {
    /// `tasks` callers on `server`, each deciding one check of `limit` under rule `rule` for
    /// its own `keys` keys in turn (`k<task>-<n>`), one request at a time.
    pub fn start(server: &str, rule: &str, limit: &str, tasks: usize, keys: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let http = Http::http1();
        let callers = (0..tasks)
            .map(|task| {
                let (http, stop) = (http.clone(), Arc::clone(&stop));
                let (server, rule, limit) = (server.to_owned(), rule.to_owned(), limit.to_owned());
                tokio::spawn(async move {
                    let mut answers = Vec::new();
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let key = format!("k{task}-{}", i % keys);
                        let sent = Instant::now();
                        let status = http
                            .decide(&server, &one_check(&rule, &key, &limit), &[])
                            .await
                            .status;
                        answers.push(Answered { sent, key, status });
                        i += 1;
                    }
                    answers
                })
            })
            .collect();
        Load { stop, callers }
    }

    /// Stops every caller after its request in flight; every request, caller by caller, each
    /// caller's in the order sent.
    pub async fn stop(self) -> Vec<Answered> {
        self.stop.store(true, Ordering::Relaxed);
        join_all(self.callers)
            .await
            .into_iter()
            .flat_map(Result::unwrap)
            .collect()
    }
}
