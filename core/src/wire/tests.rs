use super::*;

fn err(body: &str) -> String {
    DecideRequest::from_json(body.as_bytes())
        .unwrap_err()
        .to_string()
}

const CHECK: &str =
    r#"{"rule":"r","key":"k","limit":{"algorithm":"fixed_window","limit":5,"window":"1s"}}"#;

#[test]
fn a_minimal_request_parses_with_defaults() {
    let req = DecideRequest::from_json(format!(r#"{{"checks":[{CHECK}]}}"#).as_bytes()).unwrap();
    assert_eq!(req.checks[0].cost, 1);
    assert!(!req.checks[0].shadow);
}

#[test]
fn errors_name_the_field() {
    assert!(err("{").starts_with("body:"), "{}", err("{"));
    assert!(err(r#"{"checks":[]}"#).starts_with("checks: must hold"));
    assert!(
        err(r#"{"checks":[{"rule":"a b","key":"k","limit":{}}]}"#).starts_with("checks[0].rule:")
    );
    assert!(
        err(r#"{"checks":[{"rule":"r","key":"a}b","limit":{}}]}"#).starts_with("checks[0].key:")
    );
    let bad_limit = r#"{"checks":[{"rule":"r","key":"k","limit":{"algorithm":"leaky"}}]}"#;
    assert!(
        err(bad_limit).contains("unknown algorithm `leaky`"),
        "{}",
        err(bad_limit)
    );
    assert!(
        err(bad_limit).starts_with("checks[0].limit"),
        "{}",
        err(bad_limit)
    );
    let bad_type = r#"{"checks":[{"rule":"r","key":"k","limit":{"algorithm":"gcra","rate":"ten","per":"1s","burst":1}}]}"#;
    assert!(
        err(bad_type).starts_with("checks[0].limit.rate:"),
        "{}",
        err(bad_type)
    );
    let many = format!(r#"{{"checks":[{}]}}"#, vec![CHECK; 17].join(","));
    assert!(err(&many).contains("at most 16 checks"));
    let costly = r#"{"checks":[{"rule":"r","key":"k","limit":{"algorithm":"fixed_window","limit":5,"window":"1s"},"cost":1000000001}]}"#;
    assert!(
        err(costly).starts_with("checks[0].cost: must be at most"),
        "{}",
        err(costly)
    );
    assert!(err(&format!(r#"{{"checks":[{CHECK}],"extra":1}}"#)).contains("unknown field `extra`"));
    assert_eq!(
        err(&format!(r#"{{"checks":[{CHECK},{CHECK}]}}"#)),
        "checks[1]: rule `r` with key `k` is already checks[0]"
    );
}

const ASK: &str = r#"{"rule":"r","key":"k","limit":{"algorithm":"gcra","rate":10,"per":"1s","burst":10},"terms":{"max_units":5,"max_outstanding":8,"ttl":"1s"},"want":5}"#;

fn lease_err(body: &str) -> String {
    LeaseRequest::from_json(body.as_bytes())
        .unwrap_err()
        .to_string()
}

#[test]
fn lease_requests_are_validated_field_by_field() {
    let ok =
        LeaseRequest::from_json(format!(r#"{{"holder":"envoy-1:42","asks":[{ASK}]}}"#).as_bytes())
            .unwrap();
    assert_eq!(
        (ok.asks[0].want, ok.asks[0].held, ok.asks[0].returning),
        (5, 0, 0)
    );
    assert!(lease_err(&format!(r#"{{"holder":"a b","asks":[{ASK}]}}"#)).starts_with("holder:"));
    assert!(lease_err(r#"{"holder":"h","asks":[]}"#).starts_with("asks: must hold 1 to 64"));
    assert_eq!(
        lease_err(&format!(
            r#"{{"holder":"h","asks":[{}]}}"#,
            ASK.replace(r#""want":5"#, r#""want":6"#)
        )),
        "asks[0].want: must be at most terms.max_units (5), not 6"
    );
    assert!(
        lease_err(&format!(
            r#"{{"holder":"h","asks":[{}]}}"#,
            ASK.replace(r#""max_units":5"#, r#""max_units":9"#)
        ))
        .starts_with("asks[0]: `max_units` must be between 1 and `max_outstanding` (8)")
    );
    let shaping = ASK
        .replace(
            r#""burst":10}"#,
            r#""burst":10,"mode":"shaping","max_wait":"1s"}"#,
        )
        .replace("gcra", "leaky_bucket");
    assert!(
        lease_err(&format!(r#"{{"holder":"h","asks":[{shaping}]}}"#))
            .contains("shaping leaky bucket cannot be leased")
    );
    assert_eq!(
        lease_err(&format!(r#"{{"holder":"h","asks":[{ASK},{ASK}]}}"#)),
        "asks[1]: rule `r` with key `k` is already asks[0]"
    );
    assert!(lease_err(r#"{"holder":"h","asks":[{"rule":"r"}]}"#).starts_with("asks[0]"));
}

#[test]
fn a_lease_answer_is_held_to_what_was_asked() {
    let request =
        LeaseRequest::from_json(format!(r#"{{"holder":"h","asks":[{ASK}]}}"#).as_bytes()).unwrap();
    let answer = |granted: u64, lease_ms: u64| {
        request.parse_response(
            format!(
                r#"{{"grants":[{{"granted":{granted},"lease_ms":{lease_ms},"limit":10,"remaining":5}}]}}"#
            )
            .as_bytes(),
        )
    };
    let grant = answer(5, 1000).unwrap().grants[0];
    assert_eq!(
        (grant.granted, grant.lease_ms, grant.more_in_ms),
        (5, 1000, 0)
    );
    assert_eq!(
        answer(6, 1000).unwrap_err().to_string(),
        "response body: grants[0].granted is 6, more than the 5 asked"
    );
    assert_eq!(
        answer(5, 1001).unwrap_err().to_string(),
        "response body: grants[0].lease_ms is 1001, longer than the terms' ttl (1s)"
    );
    assert_eq!(
        request
            .parse_response(br#"{"grants":[]}"#)
            .unwrap_err()
            .to_string(),
        "response body: 0 grants for 1 asks"
    );
    // What the server kept of the units held: absent when all, never more than held.
    let held = |kept: u64| {
        let request = LeaseRequest::from_json(
            format!(
                r#"{{"holder":"h","asks":[{}]}}"#,
                ASK.replace(r#""want":5"#, r#""want":5,"held":3"#)
            )
            .as_bytes(),
        )
        .unwrap();
        request.parse_response(
            format!(r#"{{"grants":[{{"granted":0,"lease_ms":1000,"limit":10,"remaining":5,"kept":{kept}}}]}}"#)
                .as_bytes(),
        )
    };
    assert_eq!(grant.kept, None);
    assert_eq!(held(2).unwrap().grants[0].kept, Some(2));
    assert_eq!(
        held(4).unwrap_err().to_string(),
        "response body: grants[0].kept is 4, more than the 3 held"
    );
}

#[test]
fn a_fractional_share_is_granted_in_whole_units_that_add_up_to_it() {
    let mut carry = 0;
    let mut grants = Vec::new();
    for _ in 0..10 {
        let (whole, carried) = super::share_over_span(4_200, 1000, carry);
        grants.push(whole);
        carry = carried;
    }
    assert_eq!(grants, [4, 4, 4, 4, 5, 4, 4, 4, 4, 5]);
    assert_eq!(
        super::share_over_span(500, 5000, 0),
        (2, 500),
        "0.5 a second over 5 s"
    );
    assert!(
        super::share_over_span(u64::MAX, 1000, 999).0 <= u64::MAX / 1000,
        "saturates rather than overflowing"
    );
}
