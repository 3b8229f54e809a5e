//! Logs: `proxy_log`, `proxy_get_log_level`; WASI's stdout and stderr also end up here.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use wasmtime::{Caller, Linker};

use super::abi::Status;
use super::memory::{self, HostResult, finish, status};
use super::state::HostState;

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
    fn from_abi(n: i32) -> Option<Level> {
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

fn log(mut caller: Caller<'_, HostState>, level: i32, ptr: i32, len: i32) -> HostResult {
    let Some(level) = Level::from_abi(level) else {
        return status(Status::BadArgument);
    };
    match memory::read(&mut caller, ptr, len) {
        Ok(message) => {
            caller
                .data()
                .logs
                .write(level, String::from_utf8_lossy(&message).into_owned());
            status(Status::Ok)
        }
        Err(s) => status(s),
    }
}

fn get_log_level(mut caller: Caller<'_, HostState>, level_ptr: i32) -> HostResult {
    // Envoy's default level is info.
    finish(Ok(memory::write_u32(
        &mut caller,
        level_ptr,
        Level::Info as u32,
    )))
}

/// Adds `proxy_log` and `proxy_get_log_level`.
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_log", log)?;
    linker.func_wrap("env", "proxy_get_log_level", get_log_level)?;
    Ok(())
}
