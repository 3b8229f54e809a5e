//! Proxy-wasm shared data, the process-wide key-value store every worker's VM reads and writes,
//! as the filter logic's [`SharedData`] (whose semantics are Envoy's).

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;
use sluice_filter_logic::shared_data::{CREATE_ONLY, SharedData, WriteError};

/// The host's shared data.
pub struct HostSharedData;

impl SharedData for HostSharedData {
    fn read(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        match hostcalls::get_shared_data(key) {
            Ok((Some(bytes), cas)) => Some((bytes, cas.unwrap_or(CREATE_ONLY))),
            _ => None,
        }
    }

    fn write(&self, key: &str, value: &[u8], cas: u32) -> Result<(), WriteError> {
        match hostcalls::set_shared_data(key, Some(value), Some(cas)) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) => Err(WriteError::CasMismatch),
            Err(_) => Err(WriteError::Refused),
        }
    }
}
