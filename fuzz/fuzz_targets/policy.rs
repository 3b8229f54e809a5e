//! The filter's configuration parser on arbitrary bytes: it may refuse, never panic; and what
//! it accepts must plan checks for any request without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_core::policy::{HttpRequest, Policy};

fuzz_target!(|data: &[u8]| {
    if let Ok(policy) = Policy::from_json(data) {
        let request = HttpRequest {
            headers: [(":path".into(), data.into()), (":method".into(), b"GET".as_slice().into()), ("x-forwarded-for".into(), data.into())].into_iter().collect(),
            source_address: Some(String::from_utf8_lossy(data).into_owned()),
        };
        let _ = policy.checks_for(&request);
    }
});
