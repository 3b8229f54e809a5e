//! Leases in the module: the filter logic's [`Leases`], one for the whole Envoy behind a lock,
//! their allowances in process memory, which every worker sees ([`ProcessData`]). Requests take
//! units on their workers; the tick and the lease calls run from the configuration on Envoy's
//! main thread, so that an answer never depends on the stream that asked: a thread
//! ([`LeaseTicker`]) schedules the configuration's hook at the period the leases want, and the
//! hook sends what [`Leases::on_tick`] has to say (`on_http_filter_config_scheduled`, then
//! `on_http_filter_config_http_callout_done` with the answer).
//!
//! One `Leases` for every worker keeps the stated bound of the .wasm's, whose workers share
//! allowances through Envoy's shared data: the units a holder spends never exceed what the
//! server granted it. The lock is held for a take's few tens of nanoseconds (`sluice-bench tick`).

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use sluice_core::lease::LEASE_SLOTS;
use sluice_core::wire::{LeaseRequest, holder_name, holder_secret};
use sluice_filter_logic::lease::{Holder, LeaseTick, Leases};
use sluice_filter_logic::shared_data::{SharedData, WriteError};

use crate::abi::{self, ConfigEnvoyPtr, ConfigSchedulerPtr};
use crate::clock;
use crate::envoy::log;

/// The leases of one configuration, for every worker.
pub type ProcessLeases = Leases<Arc<ProcessData>, Arc<LeaseTicker>>;

/// A configuration's leases and the lease calls in flight.
pub struct ModuleLeases {
    leases: Mutex<ProcessLeases>,
    ticker: Arc<LeaseTicker>,
    /// By callout id: the request each lease call carried, to read its answer against.
    calls: Mutex<HashMap<u64, LeaseRequest>>,
}

impl ModuleLeases {
    /// Leases for `rules` of the configuration `config` (its pointer, kept for the tick's
    /// scheduler), named by the configuration's `fingerprint`.
    pub fn new(
        config: ConfigEnvoyPtr,
        fingerprint: String,
        rules: &[sluice_core::policy::Rule],
    ) -> ModuleLeases {
        let ticker = Arc::new(LeaseTicker::new(config));
        ticker.start();
        let leases = Leases::new(
            Arc::new(ProcessData::default()),
            fingerprint,
            holder().clone(),
            rules,
            Arc::clone(&ticker),
        )
        .process_wide();
        ModuleLeases {
            leases: Mutex::new(leases),
            ticker,
            calls: Mutex::new(HashMap::new()),
        }
    }

    /// The leases, locked.
    pub fn lock(&self) -> MutexGuard<'_, ProcessLeases> {
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The tick has run: another may be scheduled.
    pub fn ticked(&self) {
        self.ticker.pending.store(false, Ordering::Release);
    }

    /// Remembers lease call `id`, which carried `request`.
    pub fn call_sent(&self, id: u64, request: LeaseRequest) {
        self.lock_calls().insert(id, request);
    }

    /// The request lease call `id` carried, once.
    pub fn call_answered(&self, id: u64) -> Option<LeaseRequest> {
        self.lock_calls().remove(&id)
    }

    fn lock_calls(&self) -> MutexGuard<'_, HashMap<u64, LeaseRequest>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops the tick: the configuration is going away.
    pub fn stop(&self) {
        self.ticker.stop();
    }
}

/// This Envoy as a lease holder, the same for every configuration: its host name (a pod's
/// name, as Envoy's node id usually is) and the time the module first leased, so that a
/// restarted Envoy is a new holder, and a random secret that binds the name.
fn holder() -> &'static Holder {
    static HOLDER: OnceLock<Holder> = OnceLock::new();
    HOLDER.get_or_init(|| {
        let started = crate::clock::now_us() as u128 * 1000;
        let mut random = [0u8; 16];
        let secret = match getrandom::fill(&mut random) {
            Ok(()) => holder_secret(random),
            Err(e) => {
                log(
                    abi::LOG_WARN,
                    &format!("sluice: no random bytes for the lease holder's secret: {e}"),
                );
                String::new()
            }
        };
        Holder {
            name: holder_name(&host_name(), started),
            secret,
        }
    })
}

fn host_name() -> Vec<u8> {
    std::fs::read("/proc/sys/kernel/hostname")
        .map(|name| name.trim_ascii().to_vec())
        .unwrap_or_default()
}

/// The most allowances kept at once: as many as the .wasm's slots. A key seen when there are
/// this many is decided per request until the tick forgets one gone idle.
const MAX_ALLOWANCES: usize = LEASE_SLOTS as usize;

/// Allowances in process memory, with the semantics of Envoy's shared data (which the filter
/// logic's compare-and-swap is written against), each key's in a slot of its own, removed
/// when the tick forgets it; at most [`MAX_ALLOWANCES`].
#[derive(Default)]
pub struct ProcessData {
    /// Hashed with foldhash, seeded per process: std's SipHash took about 300 instructions of
    /// each read and write.
    entries: Mutex<HashMap<String, (Vec<u8>, u32), foldhash::fast::RandomState>>,
    last_cas: AtomicU32,
}

impl SharedData for ProcessData {
    fn read(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.get(key).cloned()
    }

    fn write(&self, key: &str, value: &[u8], cas: u32) -> Result<(), WriteError> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let full = entries.len() >= MAX_ALLOWANCES;
        let entry = entries.get_mut(key);
        match &entry {
            Some((_, current)) if cas != 0 && cas != *current => {
                return Err(WriteError::CasMismatch);
            }
            None if full => return Err(WriteError::Refused),
            _ => {}
        }
        // Counts from 1, as Envoy's does, never giving a key 0 (an unconditional write's).
        let next = self
            .last_cas
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1)
            .max(1);
        match entry {
            // In place: a slot is rewritten on every take from its allowance, and its key and
            // value allocated anew each time were two allocations and two frees.
            Some((bytes, current)) => {
                bytes.clear();
                bytes.extend_from_slice(value);
                *current = next;
            }
            None => {
                entries.insert(key.to_owned(), (value.to_vec(), next));
            }
        }
        Ok(())
    }

    fn remove(&self, key: &str, cas: u32) -> bool {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.get(key).is_some_and(|(_, current)| *current == cas) {
            entries.remove(key);
            return true;
        }
        false
    }
}

/// Runs the leases' tick: a thread that commits the configuration's scheduler at the period
/// the leases want, so that Envoy runs `on_http_filter_config_scheduled` on its main thread.
pub struct LeaseTicker {
    /// The period the leases want, in microseconds; 0: none.
    period_us: AtomicU64,
    /// A tick committed and not yet run: no second one is queued behind it.
    pending: AtomicBool,
    scheduler: Mutex<Scheduler>,
    /// Signalled when the period shortens or the ticker stops.
    changed: Condvar,
}

/// The configuration's scheduler, made when first needed: Envoy's scheduler holds a weak
/// reference to the configuration, which does not exist yet while the configuration is made.
struct Scheduler {
    config: usize,
    made: Option<usize>,
    stopped: bool,
}

impl LeaseTicker {
    fn new(config: ConfigEnvoyPtr) -> LeaseTicker {
        LeaseTicker {
            period_us: AtomicU64::new(0),
            pending: AtomicBool::new(false),
            scheduler: Mutex::new(Scheduler {
                config: config as usize,
                made: None,
                stopped: false,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Scheduler> {
        self.scheduler.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn period(&self) -> Option<Duration> {
        match self.period_us.load(Ordering::Acquire) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// Starts the thread, which waits while the leases want no tick.
    fn start(self: &Arc<LeaseTicker>) {
        crate::hold::pin_module();
        let ticker = Arc::clone(self);
        let started = std::thread::Builder::new()
            .name("sluice-leases".into())
            .spawn(move || ticker.run());
        if let Err(e) = started {
            log(
                abi::LOG_ERROR,
                &format!("sluice: no thread for the leases' tick: {e}"),
            );
        }
    }

    fn run(&self) {
        let mut last = clock::monotonic();
        let mut scheduler = self.lock();
        loop {
            if scheduler.stopped {
                return;
            }
            let wait = match self.period() {
                Some(period) if last.elapsed() >= period => {
                    self.commit(&mut scheduler);
                    last = clock::monotonic();
                    continue;
                }
                // A shorter period wakes it (`set_leasing`).
                Some(period) => period.saturating_sub(last.elapsed()),
                None => Duration::from_secs(1),
            };
            scheduler = self
                .changed
                .wait_timeout(scheduler, wait)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Schedules the configuration's tick on the main thread, unless one is already waiting.
    fn commit(&self, scheduler: &mut Scheduler) {
        if self.pending.load(Ordering::Acquire) {
            return;
        }
        let made = match scheduler.made {
            Some(made) => made,
            None => {
                // SAFETY: the configuration Envoy handed `config_new`; it is live until
                // `config_destroy`, which stops this ticker (under this lock) first.
                let made = unsafe {
                    abi::envoy_dynamic_module_callback_http_filter_config_scheduler_new(
                        scheduler.config as ConfigEnvoyPtr,
                    )
                };
                if made.is_null() {
                    return;
                }
                scheduler.made = Some(made as usize);
                made as usize
            }
        };
        self.pending.store(true, Ordering::Release);
        // SAFETY: a scheduler Envoy made and the module has not deleted (only `stop` deletes
        // it, under this lock); Envoy lets any thread commit, and makes a commit for a
        // configuration gone since a no-op.
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
                made as ConfigSchedulerPtr,
                0,
            );
        }
    }

    fn stop(&self) {
        let mut scheduler = self.lock();
        scheduler.stopped = true;
        if let Some(made) = scheduler.made.take() {
            // SAFETY: made by Envoy, deleted once, here; the thread commits only under this
            // lock, and sees `stopped` next.
            unsafe {
                abi::envoy_dynamic_module_callback_http_filter_config_scheduler_delete(
                    made as ConfigSchedulerPtr,
                );
            }
        }
        self.changed.notify_all();
    }
}

impl LeaseTick for LeaseTicker {
    fn set_leasing(&self, period: Option<Duration>) {
        let us = period.map_or(0, |p| (p.as_micros() as u64).max(1));
        let before = self.period_us.swap(us, Ordering::AcqRel);
        if us != 0 && (before == 0 || us < before) {
            // Under the lock, so that the thread is either waiting or yet to read the period.
            let _scheduler = self.lock();
            self.changed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use sluice_filter_logic::cas;
    use sluice_filter_logic::shared_data::CREATE_ONLY;

    use super::*;

    #[test]
    fn process_data_keeps_envoys_compare_and_swap() {
        let data = ProcessData::default();
        assert_eq!(data.read("k"), None);
        assert_eq!(data.write("k", b"a", CREATE_ONLY), Ok(()));
        let (value, cas) = data.read("k").expect("written");
        assert_eq!((value.as_slice(), cas), (&b"a"[..], 1));
        assert_eq!(
            data.write("k", b"b", CREATE_ONLY),
            Err(WriteError::CasMismatch),
            "a second creation loses"
        );
        assert_eq!(data.write("k", b"b", cas), Ok(()));
        assert_eq!(
            data.write("k", b"c", cas),
            Err(WriteError::CasMismatch),
            "a stale CAS loses"
        );
        assert_eq!(data.write("k", b"c", 0), Ok(()), "CAS 0 always writes");
        assert_eq!(data.read("k").map(|(v, _)| v), Some(b"c".to_vec()));
    }

    #[test]
    fn process_data_forgets_a_key_by_its_cas_and_keeps_at_most_max_allowances() {
        let data = ProcessData::default();
        assert_eq!(data.write("k", b"a", CREATE_ONLY), Ok(()));
        let (_, cas) = data.read("k").expect("written");
        assert!(!data.remove("k", cas + 1), "a stale CAS removes nothing");
        assert!(data.remove("k", cas));
        assert_eq!(data.read("k"), None);
        for i in 0..MAX_ALLOWANCES {
            assert_eq!(data.write(&i.to_string(), b"a", CREATE_ONLY), Ok(()));
        }
        assert_eq!(
            data.write("one more", b"a", CREATE_ONLY),
            Err(WriteError::Refused),
            "full"
        );
        assert_eq!(
            data.write("0", b"b", 0),
            Ok(()),
            "a kept key is still written"
        );
        let (_, cas) = data.read("0").expect("kept");
        assert!(data.remove("0", cas));
        assert_eq!(data.write("one more", b"a", CREATE_ONLY), Ok(()));
    }

    #[test]
    fn workers_updating_one_key_at_once_lose_no_update() {
        let data = Arc::new(ProcessData::default());
        let (workers, each) = (4, 500);
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let data = Arc::clone(&data);
                thread::spawn(move || {
                    (0..each)
                        .filter(|_| {
                            cas::update(
                                &data,
                                "count",
                                1_000,
                                |b| std::str::from_utf8(b).ok()?.parse::<u64>().ok(),
                                |n| n.to_string().into_bytes(),
                                |n| (Some(n.unwrap_or(0) + 1), ()),
                            )
                            .is_some()
                        })
                        .count()
                })
            })
            .collect();
        let done: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        let (count, _) = data.read("count").unwrap();
        assert_eq!(done, workers * each);
        assert_eq!(count, (workers * each).to_string().into_bytes());
    }
}
