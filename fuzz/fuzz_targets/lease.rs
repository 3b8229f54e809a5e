//! The lease protocol on arbitrary bytes: the server's validation of an ask, the filter's
//! reading of an answer, and an allowance read back from shared data. Each may refuse, none
//! may panic, and an answer that is read grants no more than was asked and keeps no more than
//! was held.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_core::lease::Allowance;
use sluice_core::wire::LeaseRequest;

fuzz_target!(|data: &[u8]| {
    let _ = LeaseRequest::from_json(data);
    let request = LeaseRequest::from_json(
        br#"{"holder":"envoy-1","asks":[{"rule":"a","key":"k","limit":{"algorithm":"gcra","rate":100,"per":"1s","burst":100},"terms":{"max_units":10,"max_outstanding":50,"ttl":"1s"},"want":10,"held":4}]}"#,
    )
    .expect("a valid request");
    if let Ok(answer) = request.parse_response(data) {
        for (ask, grant) in request.asks.iter().zip(&answer.grants) {
            assert!(grant.granted <= ask.want);
            assert!(grant.kept.is_none_or(|kept| kept <= ask.held));
        }
    }
    if let Some(allowance) = Allowance::decode(data) {
        assert_eq!(Allowance::decode(&allowance.encode()), Some(allowance));
    }
});
