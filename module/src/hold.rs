//! Shaping's holds: a request a shaping leaky bucket admits later waits, paused, until its
//! time, then goes on. One timer thread for the whole Envoy keeps the holds in time order and,
//! at each one's time, schedules its filter on the worker it runs on (the filter scheduler,
//! which Envoy lets any thread commit to, and which does nothing for a filter gone since);
//! the worker then lets the request go on ([`crate::hooks`], `on_http_filter_scheduled`).
//!
//! A hold's time is kept on the monotonic clock, converted once when the hold is made: the
//! request's start is read from the wall clock, and a wall clock stepped back (NTP, a VM
//! resumed) would otherwise keep held requests waiting for as long as the step.

#![allow(unsafe_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::{abi, clock};

/// The holds, earliest first, each with its filter's scheduler as an address. Envoy lets any
/// thread commit to a scheduler and delete it (abi.h); the module deletes each exactly once,
/// right after its one commit.
struct Holds {
    /// (when it is due, arrival order, the scheduler): holds due at once go in arrival order.
    queue: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    arrivals: u64,
}

/// What the timer thread does next.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Releases the hold of this scheduler, due by now.
    Release(usize),
    /// Waits this long for the earliest hold.
    Wait(Duration),
    /// Waits for a hold: there is none.
    Idle,
}

impl Holds {
    const fn new() -> Holds {
        Holds {
            queue: BinaryHeap::new(),
            arrivals: 0,
        }
    }

    fn add(&mut self, due: Instant, scheduler: usize) {
        self.arrivals += 1;
        self.queue.push(Reverse((due, self.arrivals, scheduler)));
    }

    /// What is next at `now`: one reading of the clock decides both whether the earliest hold
    /// is due and how long to wait for it, so that a clock moving on between two readings
    /// cannot make the wait negative.
    fn next(&mut self, now: Instant) -> Next {
        match self.queue.peek() {
            None => Next::Idle,
            Some(Reverse((due, _, _))) if *due > now => Next::Wait(*due - now),
            Some(_) => self
                .queue
                .pop()
                .map_or(Next::Idle, |Reverse((_, _, scheduler))| {
                    Next::Release(scheduler)
                }),
        }
    }
}

/// When a hold until `release_at_ms` on the wall clock, made at `now_ms` on it and `now` on
/// the monotonic clock, is due. A time already past is due at once.
fn due_at(release_at_ms: u64, now_ms: u64, now: Instant) -> Instant {
    let wait = Duration::from_millis(release_at_ms.saturating_sub(now_ms));
    // Due at once, rather than a panic, on a clock that could not hold the time.
    now.checked_add(wait).unwrap_or(now)
}

static HOLDS: Mutex<Holds> = Mutex::new(Holds::new());
/// Signalled when a hold is added.
static ADDED: Condvar = Condvar::new();
/// Whether the timer thread runs.
static TIMER: OnceLock<bool> = OnceLock::new();

/// Holds the request of `scheduler` (made for its filter by
/// `envoy_dynamic_module_callback_http_filter_scheduler_new`) until `release_at_ms` (since
/// the epoch); `false` if there is no timer to release it (the scheduler is then deleted).
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
        // SAFETY: a scheduler Envoy made and nothing else holds: deleted once, here.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler) };
        return false;
    }
    let due = due_at(release_at_ms, clock::now_us() / 1000, clock::monotonic());
    HOLDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .add(due, scheduler as usize);
    ADDED.notify_one();
    true
}

/// The timer thread: releases each hold at its time.
fn run() {
    let mut holds = HOLDS.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        holds = match holds.next(clock::monotonic()) {
            Next::Idle => ADDED.wait(holds).unwrap_or_else(|e| e.into_inner()),
            Next::Wait(wait) => ADDED
                .wait_timeout(holds, wait)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0),
            Next::Release(scheduler) => {
                drop(holds);
                release(scheduler as abi::SchedulerPtr);
                HOLDS.lock().unwrap_or_else(|e| e.into_inner())
            }
        };
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Holds, Next, due_at};

    #[test]
    fn holds_are_released_in_time_order_and_the_earliest_waited_for_exactly() {
        let start = crate::clock::monotonic();
        let ms = Duration::from_millis;
        let mut holds = Holds::new();
        holds.add(start + ms(30), 3);
        holds.add(start + ms(10), 1);
        holds.add(start + ms(10), 2);
        assert_eq!(holds.next(start), Next::Wait(ms(10)));
        assert_eq!(
            holds.next(start + ms(10)),
            Next::Release(1),
            "due exactly now"
        );
        assert_eq!(
            holds.next(start + ms(10)),
            Next::Release(2),
            "then its twin"
        );
        assert_eq!(holds.next(start + ms(25)), Next::Wait(ms(5)));
        // The clock moved well past the hold since it was last read: released, never a
        // wait computed from two readings.
        assert_eq!(holds.next(start + ms(900)), Next::Release(3));
        assert_eq!(holds.next(start + ms(900)), Next::Idle);
    }

    #[test]
    fn a_hold_is_timed_from_when_it_is_made_whatever_the_wall_clock_says_later() {
        let now = crate::clock::monotonic();
        let wall_ms = 1_764_000_000_000;
        assert_eq!(
            due_at(wall_ms + 250, wall_ms, now),
            now + Duration::from_millis(250)
        );
        assert_eq!(due_at(wall_ms - 5, wall_ms, now), now, "already due");
    }
}
