//! The server's request validation on arbitrary bytes: it may refuse, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_core::wire::DecideRequest;

fuzz_target!(|data: &[u8]| {
    let _ = DecideRequest::from_json(data);
});
