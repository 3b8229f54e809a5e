//! Finished streams, kept by each worker for its next requests: a stream's box and its
//! request's lists and buffers (planned checks and their key strings, verdicts, the callout's
//! body, the record) outlive the request, so that a worker deciding request after request
//! allocates nothing for them. Each allocation and its free cost about 230 of Envoy's
//! instructions through its allocator (callgrind), a leased request made ten of them, and a
//! leased request is meant to cost Envoy about what a local limiter does.
//!
//! A kept stream holds the configuration of its last request until it serves another. After
//! Envoy lets go of a configuration (a new policy pushed), each worker drops the streams it
//! kept for it at its next request, and with them the configuration's memory (its deny cache
//! can be tens of megabytes): the streams are reused last kept first, so one kept at a busy
//! moment could otherwise hold an old configuration, push after push, until the next burst.

use std::cell::RefCell;
use std::sync::Arc;

use crate::config::{self, Configured};
use crate::stream::Stream;

/// How many finished streams a worker keeps: as many as it usually has in flight at once is
/// enough, and more only hold memory.
const KEPT: usize = 16;

/// A worker's kept streams.
struct Spares {
    // Boxed: Envoy holds a live stream by its box's address, and keeping the box keeps its
    // allocation for the next stream.
    #[allow(clippy::vec_box)]
    streams: Vec<Box<Stream>>,
    /// [`config::retirements`] when the worker last dropped the streams of configurations
    /// let go of.
    retired_seen: u64,
}

impl Spares {
    /// Drops the kept streams of configurations let go of, `retired` being
    /// [`config::retirements`] now. Out of line: it runs once a push, and every request
    /// passes by it.
    #[cold]
    #[inline(never)]
    fn drop_retired(&mut self, retired: u64) {
        self.retired_seen = retired;
        self.streams.retain(|stream| !stream.serves_retired());
    }
}

thread_local! {
    static SPARES: RefCell<Spares> = const {
        RefCell::new(Spares {
            streams: Vec::new(),
            retired_seen: 0,
        })
    };
}

/// A stream for a new request of `configured`: one this worker kept, or a new one.
pub fn stream(configured: &Arc<Configured>) -> Box<Stream> {
    let spare = SPARES.with(|spares| {
        let mut spares = spares.borrow_mut();
        let retired = config::retirements();
        if retired != spares.retired_seen {
            spares.drop_retired(retired);
        }
        spares.streams.pop()
    });
    match spare {
        Some(mut stream) => {
            stream.reuse(configured);
            stream
        }
        None => Box::new(Stream::new(Arc::clone(configured))),
    }
}

/// Keeps a finished `stream` for this worker's next request, if it keeps fewer than [`KEPT`].
pub fn keep(stream: Box<Stream>) {
    SPARES.with(|spares| {
        let mut spares = spares.borrow_mut();
        if spares.streams.len() < KEPT {
            spares.streams.push(stream);
        }
    });
}
