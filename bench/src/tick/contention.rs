//! Leased takes from every worker at once, as the native module takes them: one set of leases
//! for the whole Envoy behind one lock, the allowances in the module's process memory. Each
//! worker's leased request takes that lock once, so the rate its takes reach with every core
//! taking at once is what the lock can serve a whole Envoy, however many workers it has.

use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Instant;

use sluice_core::key::LimitKey;
use sluice_core::policy::Policy;
use sluice_filter_logic::Local;
use sluice_filter_logic::lease::Leases;
use sluice_module::lease::ProcessData;

use super::setup::{ByHand, POLICY, grant_each, key_of, leased_rule, module_leases};
use crate::spread::spread;

/// Hot keys the takes cycle through.
pub const KEYS: usize = 10;
/// Takes each thread makes in a pass.
pub const TAKES: usize = 1_000_000;
/// Passes of each thread count.
pub const PASSES: usize = 5;
/// A grant no pass spends, on a lease no pass outlives: every take is from the worker's
/// purse or a refill from the allowance, never an ask.
const GRANTED: u64 = 1 << 40;
const LEASE_MS: u64 = 24 * 3_600_000;

/// The leases every thread takes from, as the module holds them.
type Shared = Mutex<Leases<Arc<ProcessData>, ByHand>>;

/// For one thread and for one a core: the takes a second, in all, of each pass.
pub fn run() -> anyhow::Result<Vec<(usize, Vec<f64>)>> {
    let cores = thread::available_parallelism().map_or(1, |n| n.get());
    let policy = Policy::from_json(POLICY.as_bytes())?;
    let (leases, keys, now) = leased(&policy)?;
    let mut counts: Vec<usize> = vec![1, cores];
    counts.dedup();
    counts
        .into_iter()
        .map(|threads| {
            eprintln!("bench: leased takes on {threads} thread(s) at once ...");
            // The first pass warms the keys' slots and the threads' caches.
            pass(&leases, &keys, &policy, now, threads)?;
            let rates = (0..PASSES)
                .map(|_| pass(&leases, &keys, &policy, now, threads))
                .collect::<anyhow::Result<Vec<_>>>()?;
            Ok((threads, rates))
        })
        .collect()
}

/// [`KEYS`] keys, each leased [`GRANTED`] units; the instant the takes are made at.
fn leased(policy: &Policy) -> anyhow::Result<(Shared, Vec<LimitKey>, u64)> {
    let (rule, config) = leased_rule(policy)?;
    let leases = module_leases(Arc::new(ProcessData::default()), policy);
    let keys = (0..KEYS)
        .map(|k| key_of(policy, k))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut now = 10_000_000_000;
    // As the tick's pass: a key's first requests mark its ask, which a tick sends.
    for _ in 0..3 {
        for key in &keys {
            leases.take(0, rule, config, key, now);
        }
    }
    let mut granted = 0;
    for call in 1.. {
        anyhow::ensure!(
            call <= 100,
            "{granted} of {KEYS} keys leased after 100 ticks"
        );
        now += 1_000;
        if let Some((request, sent)) = leases.on_tick(&policy.rules, now) {
            granted += request.asks.len();
            let grants = grant_each(&request.asks, |_| GRANTED, LEASE_MS);
            leases.sent(call, sent);
            leases.answered(call, Ok(grants), |_, _| {});
        }
        if granted >= KEYS {
            break;
        }
    }
    Ok((Mutex::new(leases), keys, now + 1_000))
}

/// `threads` threads taking [`TAKES`] each at once, each under the lock: takes a second in all.
fn pass(
    leases: &Shared,
    keys: &[LimitKey],
    policy: &Policy,
    now: u64,
    threads: usize,
) -> anyhow::Result<f64> {
    let (rule, config) = leased_rule(policy)?;
    let start = Barrier::new(threads + 1);
    let (taken, seconds) = thread::scope(|scope| {
        let takers: Vec<_> = (0..threads)
            .map(|taker| {
                let start = &start;
                scope.spawn(move || {
                    start.wait();
                    (0..TAKES)
                        .filter(|n| {
                            // Takers start on different keys, as workers serve different
                            // requests.
                            let key = &keys[(n + taker * KEYS / threads) % KEYS];
                            let leases = leases.lock().unwrap_or_else(|e| e.into_inner());
                            matches!(leases.take(0, rule, config, key, now), Local::Taken { .. })
                        })
                        .count()
                })
            })
            .collect();
        start.wait();
        let started = Instant::now();
        let taken = takers
            .into_iter()
            .map(|taker| taker.join())
            .sum::<Result<usize, _>>();
        (taken, started.elapsed().as_secs_f64())
    });
    let taken = taken.map_err(|_| anyhow::anyhow!("a taking thread panicked"))?;
    anyhow::ensure!(
        taken == threads * TAKES,
        "{taken} of {} takes were admitted from a lease that held every one",
        threads * TAKES
    );
    Ok((threads * TAKES) as f64 / seconds)
}

/// The rows of the tick section's table of takes at once.
pub fn rows(results: &[(usize, Vec<f64>)]) -> String {
    let mut out = String::from(
        "| threads taking at once | million takes a second, in all | ns a take, each thread |\n|---|---|---|\n",
    );
    for (threads, rates) in results {
        let (mid, low, high) = spread(rates.iter().map(|r| r / 1e6).collect());
        let (ns, ns_low, ns_high) =
            spread(rates.iter().map(|r| *threads as f64 * 1e9 / r).collect());
        out.push_str(&format!(
            "| {threads} | {mid:.2} [{low:.2} .. {high:.2}] | {ns:.0} [{ns_low:.0} .. {ns_high:.0}] |\n"
        ));
    }
    out
}
