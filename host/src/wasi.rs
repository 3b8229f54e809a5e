//! The WASI preview 1 functions Envoy's host provides, under both `wasi_snapshot_preview1` and
//! `wasi_unstable`.
//!
//! As in Envoy there is no file system: stdout and stderr become log lines (info and error),
//! `proc_exit` only logs, clocks read the host's clock, and other descriptors are `EBADF`.
//! `random_get` is deterministic here, so that a replay repeats exactly.

use wasmtime::{Caller, Linker};

use super::log_sink::Level;
use super::memory;
use super::state::HostState;

const SUCCESS: i32 = 0;
const EBADF: i32 = 8;
const EFAULT: i32 = 21;
const EINVAL: i32 = 28;
const ENOENT: i32 = 44;
const ENOSYS: i32 = 52;
const ENOTSUP: i32 = 58;

const MODULES: [&str; 2] = ["wasi_snapshot_preview1", "wasi_unstable"];

fn is_stdio(fd: i32) -> bool {
    fd == 1 || fd == 2
}

fn fd_write(
    mut caller: Caller<'_, HostState>,
    fd: i32,
    iovs: i32,
    iovs_len: i32,
    nwritten_ptr: i32,
) -> i32 {
    let level = match fd {
        1 => Level::Info,
        2 => Level::Error,
        _ => return EBADF,
    };
    let mut text = Vec::new();
    for i in 0..iovs_len.max(0) {
        let Ok(iovec) = memory::read(&mut caller, iovs.wrapping_add(i * 8), 8) else {
            return EFAULT;
        };
        let ptr = i32::from_le_bytes([iovec[0], iovec[1], iovec[2], iovec[3]]);
        let len = i32::from_le_bytes([iovec[4], iovec[5], iovec[6], iovec[7]]);
        match memory::read(&mut caller, ptr, len) {
            Ok(bytes) => text.extend_from_slice(&bytes),
            Err(_) => return EFAULT,
        }
    }
    let written = text.len() as u32;
    // As proxy-wasm-cpp-host's writevImpl: one trailing newline goes, and any write of at
    // least one byte is a log line, even one left empty.
    if written != 0 {
        if text.last() == Some(&b'\n') {
            text.pop();
        }
        caller
            .data()
            .logs
            .write(level, String::from_utf8_lossy(&text).into_owned());
    }
    if memory::write_u32(&mut caller, nwritten_ptr, written).is_err() {
        return EFAULT;
    }
    SUCCESS
}

fn write_zeros(mut caller: Caller<'_, HostState>, a: i32, b: i32) -> i32 {
    match memory::write_u32(&mut caller, a, 0).and_then(|()| memory::write_u32(&mut caller, b, 0)) {
        Ok(()) => SUCCESS,
        Err(_) => EFAULT,
    }
}

fn clock_time_get(
    mut caller: Caller<'_, HostState>,
    clock: i32,
    _precision: i64,
    time_ptr: i32,
) -> i32 {
    if clock != 0 && clock != 1 {
        return ENOTSUP;
    }
    let now = caller.data().now_ns;
    if memory::write_u64(&mut caller, time_ptr, now).is_err() {
        EFAULT
    } else {
        SUCCESS
    }
}

fn clock_res_get(mut caller: Caller<'_, HostState>, clock: i32, res_ptr: i32) -> i32 {
    if clock != 0 && clock != 1 {
        return ENOTSUP;
    }
    if memory::write_u64(&mut caller, res_ptr, 1).is_err() {
        EFAULT
    } else {
        SUCCESS
    }
}

fn random_get(mut caller: Caller<'_, HostState>, buf: i32, len: i32) -> i32 {
    if !(0..=64 * 1024).contains(&len) {
        return EINVAL;
    }
    let mut bytes = Vec::with_capacity(len as usize);
    let state = &mut caller.data_mut().random_state;
    while bytes.len() < len as usize {
        // splitmix64
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        bytes.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    bytes.truncate(len as usize);
    if memory::write(&mut caller, buf, &bytes).is_err() {
        EFAULT
    } else {
        SUCCESS
    }
}

fn fd_fdstat_get(mut caller: Caller<'_, HostState>, fd: i32, stat_ptr: i32) -> i32 {
    if !is_stdio(fd) {
        return EBADF;
    }
    // filetype 0, flags 0, rights_base FD_WRITE (64), rights_inheriting 0.
    let mut stat = [0u8; 24];
    stat[8..16].copy_from_slice(&64u64.to_le_bytes());
    if memory::write(&mut caller, stat_ptr, &stat).is_err() {
        EFAULT
    } else {
        SUCCESS
    }
}

fn poll_oneoff(
    mut caller: Caller<'_, HostState>,
    _in: i32,
    _out: i32,
    _n: i32,
    nevents_ptr: i32,
) -> i32 {
    if memory::write_u32(&mut caller, nevents_ptr, 0).is_err() {
        EFAULT
    } else {
        SUCCESS
    }
}

fn proc_exit(caller: Caller<'_, HostState>, code: i32) {
    caller.data().logs.write(
        Level::Error,
        format!("wasi proc_exit({code}) called; ignored"),
    );
}

fn log_and_succeed(caller: Caller<'_, HostState>, what: &str) -> i32 {
    caller
        .data()
        .logs
        .write(Level::Error, format!("wasi {what} called; ignored"));
    SUCCESS
}

macro_rules! both {
    ($linker:expr, $name:literal, $f:expr) => {
        for module in MODULES {
            $linker.func_wrap(module, $name, $f)?;
        }
    };
}

/// Adds Envoy's WASI functions under both module names.
pub fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    type C<'a> = Caller<'a, HostState>;
    both!(linker, "fd_write", fd_write);
    both!(linker, "fd_read", |_: C<'_>,
                              _: i32,
                              _: i32,
                              _: i32,
                              _: i32| {
        ENOSYS
    });
    both!(linker, "fd_seek", |c: C<'_>,
                              _: i32,
                              _: i64,
                              _: i32,
                              _: i32| {
        log_and_succeed(c, "fd_seek")
    });
    both!(linker, "fd_close", |c: C<'_>, _: i32| log_and_succeed(
        c, "fd_close"
    ));
    both!(linker, "fd_fdstat_get", fd_fdstat_get);
    both!(linker, "fd_fdstat_set_flags", |_: C<'_>, _: i32, _: i32| {
        ENOSYS
    });
    both!(
        linker,
        "fd_fdstat_set_rights",
        |_: C<'_>, fd: i32, _: i64, _: i64| if is_stdio(fd) { ENOTSUP } else { EBADF }
    );
    both!(linker, "environ_get", |_: C<'_>, _: i32, _: i32| SUCCESS);
    both!(linker, "environ_sizes_get", write_zeros);
    both!(linker, "args_get", |_: C<'_>, _: i32, _: i32| SUCCESS);
    both!(linker, "args_sizes_get", write_zeros);
    both!(linker, "clock_time_get", clock_time_get);
    both!(linker, "clock_res_get", clock_res_get);
    both!(
        linker,
        "fd_advise",
        |_: C<'_>, _: i32, _: i64, _: i64, _: i32| SUCCESS
    );
    both!(
        linker,
        "fd_allocate",
        |_: C<'_>, fd: i32, _: i64, _: i64| if is_stdio(fd) { SUCCESS } else { EBADF }
    );
    both!(linker, "fd_datasync", |_: C<'_>, fd: i32| if is_stdio(fd) {
        SUCCESS
    } else {
        EBADF
    });
    both!(linker, "fd_sync", |_: C<'_>, fd: i32| if is_stdio(fd) {
        SUCCESS
    } else {
        EBADF
    });
    both!(linker, "fd_filestat_get", |_: C<'_>, _: i32, _: i32| EBADF);
    both!(
        linker,
        "fd_filestat_set_size",
        |_: C<'_>, fd: i32, _: i64| if is_stdio(fd) { EINVAL } else { EBADF }
    );
    both!(
        linker,
        "fd_filestat_set_times",
        |_: C<'_>, fd: i32, _: i64, _: i64, _: i32| if is_stdio(fd) { ENOSYS } else { EBADF }
    );
    both!(linker, "fd_pread", |_: C<'_>,
                               fd: i32,
                               _: i32,
                               _: i32,
                               _: i64,
                               _: i32| if is_stdio(fd) {
        ENOSYS
    } else {
        EBADF
    });
    both!(
        linker,
        "fd_pwrite",
        |_: C<'_>, fd: i32, _: i32, _: i32, _: i64, _: i32| if is_stdio(fd) {
            ENOSYS
        } else {
            EBADF
        }
    );
    both!(
        linker,
        "fd_readdir",
        |_: C<'_>, _: i32, _: i32, _: i32, _: i64, _: i32| EBADF
    );
    both!(linker, "fd_renumber", |_: C<'_>, _: i32, _: i32| EBADF);
    both!(
        linker,
        "fd_tell",
        |_: C<'_>, fd: i32, _: i32| if is_stdio(fd) { ENOSYS } else { EBADF }
    );
    both!(linker, "fd_prestat_get", |_: C<'_>, _: i32, _: i32| EBADF);
    both!(
        linker,
        "fd_prestat_dir_name",
        |_: C<'_>, _: i32, _: i32, _: i32| ENOSYS
    );
    both!(
        linker,
        "path_open",
        |_: C<'_>, _: i32, _: i32, _: i32, _: i32, _: i32, _: i64, _: i64, _: i32, _: i32| ENOENT
    );
    both!(
        linker,
        "path_filestat_get",
        |_: C<'_>, _: i32, _: i32, _: i32, _: i32, _: i32| ENOTSUP
    );
    both!(
        linker,
        "path_create_directory",
        |_: C<'_>, _: i32, _: i32, _: i32| ENOSYS
    );
    both!(
        linker,
        "path_filestat_set_times",
        |_: C<'_>, _: i32, _: i32, _: i32, _: i32, _: i64, _: i64, _: i32| ENOSYS
    );
    both!(
        linker,
        "path_link",
        |_: C<'_>, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| ENOSYS
    );
    both!(
        linker,
        "path_readlink",
        |_: C<'_>, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| ENOSYS
    );
    both!(
        linker,
        "path_remove_directory",
        |_: C<'_>, _: i32, _: i32, _: i32| ENOSYS
    );
    both!(
        linker,
        "path_rename",
        |_: C<'_>, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| ENOSYS
    );
    both!(
        linker,
        "path_symlink",
        |_: C<'_>, _: i32, _: i32, _: i32, _: i32, _: i32| ENOSYS
    );
    both!(
        linker,
        "path_unlink_file",
        |_: C<'_>, _: i32, _: i32, _: i32| ENOSYS
    );
    both!(linker, "sock_accept", |_: C<'_>, _: i32, _: i32, _: i32| {
        ENOTSUP
    });
    both!(
        linker,
        "sock_recv",
        |_: C<'_>, _: i32, _: i32, _: i32, _: i32, _: i32, _: i32| ENOTSUP
    );
    both!(
        linker,
        "sock_send",
        |_: C<'_>, _: i32, _: i32, _: i32, _: i32, _: i32| ENOTSUP
    );
    both!(linker, "sock_shutdown", |_: C<'_>, _: i32, _: i32| ENOTSUP);
    both!(linker, "random_get", random_get);
    both!(linker, "sched_yield", |_: C<'_>| SUCCESS);
    both!(linker, "poll_oneoff", poll_oneoff);
    both!(linker, "proc_exit", proc_exit);
    Ok(())
}
