//! The server's request validation on arbitrary bytes: it may refuse, never panic, and the
//! server's fast reader never reads a body differently from serde.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_core::wire::{DecideRequest, read_canonical_request};

fuzz_target!(|data: &[u8]| {
    let _ = DecideRequest::from_json(data);
    if let Some(fast) = read_canonical_request(data) {
        let serde = serde_json::from_slice::<DecideRequest>(data);
        assert_eq!(Some(fast), serde.ok());
    }
});
