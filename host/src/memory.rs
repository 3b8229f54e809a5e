//! Reading and writing the module's memory, bounds-checked.
//!
//! A pointer outside the memory is the module's error: it gets `InvalidMemoryAccess`, as from
//! Envoy, never a host panic. Memory handed to the module is allocated with the module's own
//! allocator (`malloc`, else `proxy_on_memory_allocate`); an allocator that traps traps the call.

use wasmtime::Caller;

use super::abi::Status;
use super::state::HostState;

/// A host call's outcome: a status for the module, or a trap.
pub type HostResult = wasmtime::Result<i32>;

/// Converts a status into a host call's result.
pub fn status(s: Status) -> HostResult {
    Ok(s.into())
}

/// An error that is reported to the module as a status.
pub type Access<T> = Result<T, Status>;

fn memory(caller: &mut Caller<'_, HostState>) -> Access<wasmtime::Memory> {
    caller
        .data()
        .guest
        .memory
        .ok_or(Status::InvalidMemoryAccess)
}

/// The bytes from `ptr` to `ptr + len`, as an index range (not yet checked against the
/// memory's size).
fn region(ptr: i32, len: usize) -> Access<std::ops::Range<usize>> {
    let start = ptr as u32 as usize;
    let end = start.checked_add(len).ok_or(Status::InvalidMemoryAccess)?;
    Ok(start..end)
}

/// `len` bytes at `ptr`.
pub fn read(caller: &mut Caller<'_, HostState>, ptr: i32, len: i32) -> Access<Vec<u8>> {
    let memory = memory(caller)?;
    memory
        .data(&caller)
        .get(region(ptr, len as u32 as usize)?)
        .map(<[u8]>::to_vec)
        .ok_or(Status::InvalidMemoryAccess)
}

/// Runs `f` on the `len` bytes at `ptr` and the host's state, without copying the bytes out
/// (Envoy's host reads a call's arguments in place too).
pub fn with_bytes<R>(
    caller: &mut Caller<'_, HostState>,
    ptr: i32,
    len: i32,
    f: impl FnOnce(&[u8], &mut HostState) -> Access<R>,
) -> Access<R> {
    let memory = memory(caller)?;
    let (data, state) = memory.data_and_store_mut(caller);
    let bytes = data
        .get(region(ptr, len as u32 as usize)?)
        .ok_or(Status::InvalidMemoryAccess)?;
    f(bytes, state)
}

/// Writes `bytes` at `ptr`.
pub fn write(caller: &mut Caller<'_, HostState>, ptr: i32, bytes: &[u8]) -> Access<()> {
    let memory = memory(caller)?;
    memory
        .data_mut(caller)
        .get_mut(region(ptr, bytes.len())?)
        .ok_or(Status::InvalidMemoryAccess)?
        .copy_from_slice(bytes);
    Ok(())
}

/// Writes a little-endian u32 at `ptr`.
pub fn write_u32(caller: &mut Caller<'_, HostState>, ptr: i32, value: u32) -> Access<()> {
    write(caller, ptr, &value.to_le_bytes())
}

/// Writes a little-endian u64 at `ptr`.
pub fn write_u64(caller: &mut Caller<'_, HostState>, ptr: i32, value: u64) -> Access<()> {
    write(caller, ptr, &value.to_le_bytes())
}

/// Copies `data` into memory allocated by the module, and writes its address and size at
/// `ptr_ptr` and `size_ptr`. Empty data is written as a null pointer and size 0, as Envoy does.
///
/// The outer `Result` is a trap (the allocator trapped); the inner one a status.
pub fn give(
    caller: &mut Caller<'_, HostState>,
    data: &[u8],
    ptr_ptr: i32,
    size_ptr: i32,
) -> wasmtime::Result<Access<()>> {
    give_with(
        caller,
        data.len(),
        |dest, _| {
            dest.copy_from_slice(data);
            Ok(())
        },
        (ptr_ptr, size_ptr),
    )
}

/// As [`give`], for bytes the host's state holds, copied from there into the module's memory
/// with no copy in between, as Envoy copies from its own maps and buffers. `held` finds them:
/// once for their size, and again after the module's allocator ran; bytes whose size changed
/// meanwhile are `InternalFailure`.
pub fn give_held(
    caller: &mut Caller<'_, HostState>,
    held: impl Fn(&mut HostState) -> Access<&[u8]>,
    ptr_ptr: i32,
    size_ptr: i32,
) -> wasmtime::Result<Access<()>> {
    let size = match held(caller.data_mut()) {
        Ok(bytes) => bytes.len(),
        Err(s) => return Ok(Err(s)),
    };
    give_with(
        caller,
        size,
        |dest, state| {
            let bytes = held(state)?;
            if bytes.len() != size {
                return Err(Status::InternalFailure);
            }
            dest.copy_from_slice(bytes);
            Ok(())
        },
        (ptr_ptr, size_ptr),
    )
}

/// Allocates `size` bytes with the module's allocator, has `fill` write them (beside the
/// host's state), and writes their address and size at `ptr_ptr` and `size_ptr`.
fn give_with(
    caller: &mut Caller<'_, HostState>,
    size: usize,
    fill: impl FnOnce(&mut [u8], &mut HostState) -> Access<()>,
    (ptr_ptr, size_ptr): (i32, i32),
) -> wasmtime::Result<Access<()>> {
    let address = match allocate(caller, size)? {
        Ok(address) => address,
        Err(s) => return Ok(Err(s)),
    };
    if address != 0 {
        let filled = memory(caller).and_then(|memory| {
            let (data, state) = memory.data_and_store_mut(&mut *caller);
            let dest = data
                .get_mut(region(address, size)?)
                .ok_or(Status::InvalidMemoryAccess)?;
            fill(dest, state)
        });
        if let Err(s) = filled {
            return Ok(Err(s));
        }
    }
    Ok(write_u32(caller, ptr_ptr, address as u32)
        .and_then(|()| write_u32(caller, size_ptr, size as u32)))
}

/// `size` bytes from the module's allocator; 0 for none. The outer `Result` is a trap.
fn allocate(caller: &mut Caller<'_, HostState>, size: usize) -> wasmtime::Result<Access<i32>> {
    if size == 0 {
        return Ok(Ok(0));
    }
    let Some(allocate) = caller.data().guest.allocator.clone() else {
        return Ok(Err(Status::InvalidMemoryAccess));
    };
    let Ok(size) = i32::try_from(size) else {
        return Ok(Err(Status::InvalidMemoryAccess));
    };
    Ok(match allocate.call(&mut *caller, size)? {
        0 => Err(Status::InvalidMemoryAccess),
        address => Ok(address),
    })
}

/// Unwraps an [`Access`] inside a host call, or returns its status to the module.
macro_rules! or_status {
    ($access:expr) => {
        match $access {
            Ok(value) => value,
            Err(s) => return $crate::memory::status(s),
        }
    };
}
pub(crate) use or_status;

/// Reads two regions (a key and a value, most often).
pub fn read_two(
    caller: &mut Caller<'_, HostState>,
    a: (i32, i32),
    b: (i32, i32),
) -> Access<(Vec<u8>, Vec<u8>)> {
    Ok((read(caller, a.0, a.1)?, read(caller, b.0, b.1)?))
}

/// Runs `body` and turns its status into the host call's return value.
pub fn finish(result: wasmtime::Result<Access<()>>) -> HostResult {
    match result? {
        Ok(()) => status(Status::Ok),
        Err(s) => status(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pointer_is_read_unsigned_and_a_region_that_wraps_is_refused() {
        assert_eq!(region(16, 4), Ok(16..20));
        // Envoy reads the module's i32 pointers as u32: past 2 GiB is an address, not an error
        // (the memory's size decides).
        assert_eq!(region(-1, 1), Ok(0xffff_ffff..0x1_0000_0000));
        assert_eq!(region(i32::MIN, 0), Ok(0x8000_0000..0x8000_0000));
        assert_eq!(region(-1, usize::MAX), Err(Status::InvalidMemoryAccess));
    }
}
