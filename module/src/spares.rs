//! Finished streams, kept by each worker for its next requests: a stream's box and its
//! request's lists and buffers (planned checks and their key strings, verdicts, the callout's
//! body, the record) outlive the request, so that a worker deciding request after request
//! allocates nothing for them. Each allocation and its free cost about 230 of Envoy's
//! instructions through its allocator (callgrind), a leased request made ten of them, and a
//! leased request is meant to cost Envoy about what a local limiter does.
//!
//! A kept stream holds the configuration of its last request until it serves another: after
//! a configuration goes away, its memory is freed with that worker's next request, or when the
//! worker ends.

use std::cell::RefCell;
use std::sync::Arc;

use crate::config::Configured;
use crate::stream::Stream;

/// How many finished streams a worker keeps: as many as it usually has in flight at once is
/// enough, and more only hold memory.
const KEPT: usize = 16;

thread_local! {
    // Boxed: Envoy holds a live stream by its box's address, and keeping the box keeps its
    // allocation for the next stream.
    #[allow(clippy::vec_box)]
    static SPARES: RefCell<Vec<Box<Stream>>> = const { RefCell::new(Vec::new()) };
}

/// A stream for a new request of `configured`: one this worker kept, or a new one.
pub fn stream(configured: &Arc<Configured>) -> Box<Stream> {
    let spare = SPARES.with(|spares| spares.borrow_mut().pop());
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
        if spares.len() < KEPT {
            spares.push(stream);
        }
    });
}
