//! The parser of sluice-server's answers on arbitrary bytes: garbage is an error, never a
//! panic, and the filter's fast reader never reads a text differently from serde.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_core::wire::{DecideRequest, DecideResponse, read_canonical};

fuzz_target!(|data: &[u8]| {
    let request = DecideRequest::from_json(
        br#"{"checks":[{"rule":"a","key":"k","limit":{"algorithm":"gcra","rate":1,"per":"1s","burst":1}},
                       {"rule":"b","key":"k","limit":{"algorithm":"sliding_log","limit":1,"window":"1s"}}]}"#,
    )
    .expect("a valid request");
    let _ = request.parse_response(data);
    if let Some(fast) = read_canonical(data) {
        let serde = serde_json::from_slice::<DecideResponse>(data).map(|r| r.results);
        assert_eq!(Some(fast), serde.ok());
    }
});
