//! Logs: `proxy_log`, `proxy_get_log_level`; WASI's stdout and stderr also end up here.

use wasmtime::{Caller, Linker};

use super::abi::Status;
use super::log_sink::Level;
use super::memory::{self, HostResult, finish, status};
use super::state::HostState;

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
