use super::*;

fn parse(json: &str) -> Result<Limit, String> {
    serde_json::from_str::<Limit>(json).map_err(|e| e.to_string())
}

#[test]
fn every_algorithm_round_trips_through_json() {
    for json in [
        r#"{"algorithm":"fixed_window","limit":10,"window":"1s"}"#,
        r#"{"algorithm":"sliding_log","limit":10,"window":"1m"}"#,
        r#"{"algorithm":"sliding_window","limit":10,"window":"1h"}"#,
        r#"{"algorithm":"token_bucket","rate":5,"per":"1s","burst":10}"#,
        r#"{"algorithm":"leaky_bucket","rate":5,"per":"1s","burst":10}"#,
        r#"{"algorithm":"leaky_bucket","rate":5,"per":"1s","burst":10,"mode":"shaping","max_wait":"2s"}"#,
        r#"{"algorithm":"gcra","rate":5,"per":"1d","burst":10}"#,
    ] {
        let limit = parse(json).unwrap();
        assert_eq!(serde_json::to_string(&limit).unwrap(), json);
    }
}

#[test]
fn errors_name_the_field_and_the_reason() {
    let cases = [
        (
            r#"{"algorithm":"nope","limit":1,"window":"1s"}"#,
            "unknown algorithm `nope`",
        ),
        (
            r#"{"algorithm":"gcra","rate":1,"per":"1s"}"#,
            "needs `burst`",
        ),
        (
            r#"{"algorithm":"gcra","rate":1,"per":"1s","burst":1,"window":"1s"}"#,
            "`window` does not apply",
        ),
        (
            r#"{"algorithm":"fixed_window","limit":0,"window":"1s"}"#,
            "`limit` must be between 1 and 1000000000, not 0",
        ),
        (
            r#"{"algorithm":"sliding_log","limit":100001,"window":"1s"}"#,
            "between 1 and 100000",
        ),
        (
            r#"{"algorithm":"fixed_window","limit":1,"window":"31d"}"#,
            "`window` must be at most 30d",
        ),
        (
            r#"{"algorithm":"fixed_window","limit":1,"window":"1 s"}"#,
            "is not a duration",
        ),
        (
            r#"{"algorithm":"fixed_window","limit":1,"window":"1s","extra":1}"#,
            "unknown field `extra`",
        ),
        (
            r#"{"algorithm":"leaky_bucket","rate":1,"per":"1s","burst":1,"mode":"shaping"}"#,
            "needs `max_wait`",
        ),
        (
            r#"{"algorithm":"leaky_bucket","rate":1,"per":"1s","burst":1,"max_wait":"1s"}"#,
            "`max_wait` does not apply",
        ),
        (
            r#"{"algorithm":"leaky_bucket","rate":1,"per":"1s","burst":1,"mode":"drip"}"#,
            "`mode` must be",
        ),
        (
            r#"{"algorithm":"token_bucket","rate":-1,"per":"1s","burst":1}"#,
            "invalid value: integer `-1`",
        ),
        (
            r#"{"algorithm":"gcra","rate":1,"per":"1d","burst":3651}"#,
            "must be at most 3650d, not 3651 days",
        ),
    ];
    for (json, expected) in cases {
        let err = parse(json).unwrap_err();
        assert!(err.contains(expected), "{json}: {err}");
    }
}

#[test]
fn the_admission_bound_follows_the_documented_table() {
    let fw = parse(r#"{"algorithm":"fixed_window","limit":10,"window":"1s"}"#).unwrap();
    assert_eq!(fw.admission_bound(1000), 20);
    let log = parse(r#"{"algorithm":"sliding_log","limit":10,"window":"1s"}"#).unwrap();
    assert_eq!(log.admission_bound(1000), 10);
    let gcra = parse(r#"{"algorithm":"gcra","rate":10,"per":"1s","burst":5}"#).unwrap();
    assert_eq!(gcra.admission_bound(1000), 15);
}
