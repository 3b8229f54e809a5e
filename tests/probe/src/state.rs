//! What one VM of the probe knows, one per thread as a VM is.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::script::Script;

/// What one VM of the probe knows.
#[derive(Default)]
pub(crate) struct Probe {
    pub(crate) initialized: bool,
    pub(crate) vm_starts: u32,
    pub(crate) script: Script,
    /// Stream context id → its ordinal among this VM's streams (1-based).
    pub(crate) streams: HashMap<u32, u32>,
    pub(crate) newest_stream: u32,
    pub(crate) metrics: HashMap<String, u32>,
}

thread_local! {
    static PROBE: RefCell<Probe> = RefCell::new(Probe::default());
}

/// Runs `f` on this VM's probe.
pub(crate) fn with<T>(f: impl FnOnce(&mut Probe) -> T) -> T {
    PROBE.with(|p| f(&mut p.borrow_mut()))
}
