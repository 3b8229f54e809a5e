//! Shaping's holds: a request a shaping leaky bucket admits later waits, paused, until its
//! time, then goes on. One timer thread for the whole Envoy keeps the holds in time order and,
//! at each one's time, schedules its filter on the worker it runs on (the filter scheduler,
//! which Envoy lets any thread commit to, and which does nothing for a filter gone since);
//! the worker then lets the request go on ([`crate::hooks`], `on_http_filter_scheduled`).

#![allow(unsafe_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

use crate::abi;

/// The holds, earliest first: (release time in ms since the epoch, arrival order, the
/// filter's scheduler as an address). Envoy lets any thread commit to a scheduler and delete
/// it (abi.h); the module deletes each exactly once, right after its one commit.
type Queue = BinaryHeap<Reverse<(u64, u64, usize)>>;

/// The holds and how many there have been.
static HOLDS: Mutex<(Queue, u64)> = Mutex::new((BinaryHeap::new(), 0));
/// Signalled when a hold is added.
static ADDED: Condvar = Condvar::new();
/// Whether the timer thread runs.
static TIMER: OnceLock<bool> = OnceLock::new();

/// Holds the request of `scheduler` (made for its filter by
/// `envoy_dynamic_module_callback_http_filter_scheduler_new`) until `release_at_ms`; `false`
/// if there is no timer to release it.
pub fn hold(scheduler: abi::SchedulerPtr, release_at_ms: u64) -> bool {
    let running = *TIMER.get_or_init(|| {
        // The thread runs the module's code for as long as the process lives: Envoy must
        // never unload the module under it.
        pin_module();
        std::thread::Builder::new()
            .name("sluice-holds".into())
            .spawn(run)
            .map_err(|e| {
                crate::envoy::log(
                    abi::LOG_ERROR,
                    &format!("sluice: no timer thread for shaping: {e}"),
                )
            })
            .is_ok()
    });
    if !running {
        return false;
    }
    let mut guard = HOLDS.lock().unwrap_or_else(|e| e.into_inner());
    let (queue, arrivals) = &mut *guard;
    *arrivals += 1;
    queue.push(Reverse((release_at_ms, *arrivals, scheduler as usize)));
    ADDED.notify_one();
    true
}

fn now_ms() -> u64 {
    crate::clock::now_us() / 1000
}

/// The timer thread: releases each hold at its time.
fn run() {
    let mut guard = HOLDS.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let due = guard.0.peek().map(|Reverse((at, _, _))| *at);
        match due {
            None => {
                guard = ADDED.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
            Some(at) if at > now_ms() => {
                let wait = Duration::from_millis(at - now_ms());
                guard = ADDED
                    .wait_timeout(guard, wait)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
            Some(_) => {
                if let Some(Reverse((_, _, ptr))) = guard.0.pop() {
                    drop(guard);
                    release(ptr as abi::SchedulerPtr);
                    guard = HOLDS.lock().unwrap_or_else(|e| e.into_inner());
                }
            }
        }
    }
}

fn release(scheduler: abi::SchedulerPtr) {
    // SAFETY: a scheduler Envoy made and the module has not deleted: committed once, then
    // deleted once, here; Envoy makes a commit to a filter that is gone a no-op.
    unsafe {
        abi::envoy_dynamic_module_callback_http_filter_scheduler_commit(scheduler, 0);
        abi::envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler);
    }
}

/// Keeps this module loaded for the life of the process, whatever Envoy's configuration
/// does: a `dlopen` of its own file with `RTLD_NODELETE`.
pub fn pin_module() {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: `dladdr` reads the address of a function of this module and writes `info`, a
    // live local; `dlopen` takes the NUL-terminated path it found, which the loader owns.
    unsafe {
        if libc::dladdr(pin_module as *const libc::c_void, &mut info) != 0
            && !info.dli_fname.is_null()
        {
            libc::dlopen(
                info.dli_fname,
                libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
            );
        }
    }
}
