//! The parsers that read what others send — the filter's configuration, the server's answer,
//! the filter's request — on arbitrary bytes and on JSON built from their own vocabulary: they
//! may refuse, they never panic. (The same targets run under libFuzzer in `fuzz/`.)

#![allow(clippy::unwrap_used)] // test code

use proptest::prelude::*;
use serde_json::Value;
use sluice_core::policy::{HttpRequest, Policy};
use sluice_core::wire::DecideRequest;

/// Field names and values the parsers know, so that generated documents get deep.
fn vocabulary_json() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("cluster"),
        Just("rules"),
        Just("name"),
        Just("key"),
        Just("limit"),
        Just("algorithm"),
        Just("rate"),
        Just("per"),
        Just("burst"),
        Just("window"),
        Just("mode"),
        Just("max_wait"),
        Just("match"),
        Just("path"),
        Just("prefix"),
        Just("regex"),
        Just("exact"),
        Just("headers"),
        Just("present"),
        Just("method"),
        Just("host"),
        Just("header"),
        Just("query"),
        Just("const"),
        Just("default"),
        Just("cost"),
        Just("shadow"),
        Just("deny_cache"),
        Just("slots"),
        Just("response"),
        Just("status"),
        Just("checks"),
        Just("rule"),
        Just("results"),
        Just("allowed"),
        Just("retry_after_ms"),
        Just("trusted_hops"),
        Just("timeout"),
        Just("failure_mode"),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (0u64..20).prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop_oneof![
            Just("gcra"),
            Just("sliding_log"),
            Just("leaky_bucket"),
            Just("fixed_window"),
            Just("shaping"),
            Just("1s"),
            Just("0ms"),
            Just("99999999999d"),
            Just("client_ip"),
            Just("("),
            Just("[a-"),
            Just("GET"),
            Just("x"),
            Just(""),
            Just("é}{"),
        ]
        .prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6).prop_map(|fields| Value::Object(
                fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
            )),
        ]
    })
}

fn any_input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        vocabulary_json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_configuration_parser_never_panics(data in any_input(), path in prop::collection::vec(any::<u8>(), 0..40)) {
        if let Ok(policy) = Policy::from_json(&data) {
            let request = HttpRequest {
                headers: vec![(":path".into(), path.clone()), (":method".into(), b"GET".to_vec()), ("x-forwarded-for".into(), path)],
                source_address: Some("203.0.113.9:80".into()),
            };
            let _ = policy.checks_for(&request);
        }
    }

    #[test]
    fn the_answer_parser_never_panics(data in any_input()) {
        let request = DecideRequest::from_json(br#"{"checks":[{"rule":"a","key":"k","limit":{"algorithm":"gcra","rate":1,"per":"1s","burst":1}}]}"#).unwrap();
        let _ = request.parse_response(&data);
    }

    #[test]
    fn the_request_parser_never_panics(data in any_input()) {
        let _ = DecideRequest::from_json(&data);
    }
}
