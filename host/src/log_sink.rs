//! Where a VM's log lines go: kept, and counted by level.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// proxy-wasm log levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// 0
    Trace,
    /// 1
    Debug,
    /// 2
    Info,
    /// 3
    Warn,
    /// 4
    Error,
    /// 5
    Critical,
}

impl Level {
    pub(super) fn from_abi(n: i32) -> Option<Level> {
        Some(match n {
            0 => Level::Trace,
            1 => Level::Debug,
            2 => Level::Info,
            3 => Level::Warn,
            4 => Level::Error,
            5 => Level::Critical,
            _ => return None,
        })
    }
}

/// One log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Its level.
    pub level: Level,
    /// Which VM (worker index) wrote it.
    pub worker: usize,
    /// The message.
    pub message: String,
}

/// Keeps the most recent lines, counts them all, and echoes some to stderr.
#[derive(Clone)]
pub struct LogSink {
    inner: Arc<Mutex<LogBook>>,
    worker: usize,
}

struct LogBook {
    recent: VecDeque<LogLine>,
    counts: [u64; 6],
    echo_from: Option<Level>,
}

/// How many recent lines are kept.
const KEPT: usize = 2000;

impl LogSink {
    /// A sink that echoes lines at `echo_from` and above to stderr (none: quiet).
    pub fn new(echo_from: Option<Level>) -> LogSink {
        LogSink {
            inner: Arc::new(Mutex::new(LogBook {
                recent: VecDeque::new(),
                counts: [0; 6],
                echo_from,
            })),
            worker: 0,
        }
    }

    /// The same sink, labelling lines with `worker`.
    pub fn for_worker(&self, worker: usize) -> LogSink {
        LogSink {
            inner: Arc::clone(&self.inner),
            worker,
        }
    }

    /// Records a line.
    pub fn write(&self, level: Level, message: String) {
        let mut book = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        book.counts[level as usize] += 1;
        if book.echo_from.is_some_and(|from| level >= from) {
            eprintln!("wasm log [worker {}] {level:?}: {message}", self.worker);
        }
        if book.recent.len() == KEPT {
            book.recent.pop_front();
        }
        book.recent.push_back(LogLine {
            level,
            worker: self.worker,
            message,
        });
    }

    /// The most recent lines.
    pub fn recent(&self) -> Vec<LogLine> {
        let book = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        book.recent.iter().cloned().collect()
    }

    /// Lines written at `level`.
    pub fn count(&self, level: Level) -> u64 {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .counts[level as usize]
    }
}
