//! The hand-written `/v1/decide` writers and readers (the filter's and the server's) against
//! serde on the wire types: the same bytes out, the same values in, and no text read
//! differently.

#![allow(clippy::unwrap_used)] // test code

use proptest::prelude::*;
use sluice_core::key::{LimitKey, RuleName};
use sluice_core::limit::Limit;
use sluice_core::record::{self, RuleOutcome, RuleRecord};
use sluice_core::verdict::Verdict;
use sluice_core::wire::{
    Check, CheckTemplate, DecideRequest, DecideResponse, read_canonical, read_canonical_request,
    read_decide_response, write_decide_request, write_decide_response,
};

const LIMITS: [&str; 6] = [
    r#"{"algorithm":"fixed_window","limit":5,"window":"1s"}"#,
    r#"{"algorithm":"sliding_log","limit":100,"window":"1m"}"#,
    r#"{"algorithm":"sliding_window","limit":3000,"window":"1h"}"#,
    r#"{"algorithm":"token_bucket","rate":200,"per":"1s","burst":400}"#,
    r#"{"algorithm":"leaky_bucket","rate":7,"per":"3s","burst":2,"mode":"shaping","max_wait":"250ms"}"#,
    r#"{"algorithm":"gcra","rate":15,"per":"1s","burst":30}"#,
];

fn check() -> impl Strategy<Value = Check> {
    (
        "[a-zA-Z0-9_.-]{1,20}",
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..4),
        0..LIMITS.len(),
        0u64..1000,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(rule, parts, limit, cost, count_denied, shadow)| Check {
            rule: RuleName::new(rule).unwrap(),
            key: LimitKey::from_parts(parts.iter().map(Vec::as_slice)),
            limit: serde_json::from_str::<Limit>(LIMITS[limit]).unwrap(),
            cost,
            count_denied,
            shadow,
        })
}

fn verdict() -> impl Strategy<Value = Verdict> {
    (
        any::<bool>(),
        any::<u64>(),
        any::<u64>(),
        0u64..1 << 40,
        prop::option::of(any::<u64>()),
        prop_oneof![Just(0u64), any::<u64>()],
    )
        .prop_map(
            |(allowed, limit, remaining, reset_ms, retry_after_ms, delay_ms)| Verdict {
                allowed,
                limit,
                remaining,
                reset_ms,
                retry_after_ms,
                delay_ms,
            },
        )
}

/// `body` with the byte at `cut` replaced by `byte`, `byte` inserted there, or that byte
/// removed (`how`: 0, 1, 2).
fn mutated(mut body: Vec<u8>, cut: prop::sample::Index, byte: u8, how: u8) -> Vec<u8> {
    let at = cut.index(body.len());
    match how {
        0 => body[at] = byte,
        1 => body.insert(at, byte),
        _ => {
            body.remove(at);
        }
    }
    body
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn the_written_body_is_byte_for_byte_what_serde_writes(
        checks in prop::collection::vec(check(), 1..6),
        quote in any::<bool>(),
    ) {
        let mut checks = checks;
        if quote {
            // Keys may hold the two characters JSON escapes.
            checks[0].key = LimitKey::parse(r#"a"b\c"#).unwrap();
        }
        let templates: Vec<CheckTemplate> = checks
            .iter()
            .map(|c| CheckTemplate::new(&c.rule, &c.limit, c.cost, c.count_denied, c.shadow))
            .collect();
        let mut body = Vec::new();
        write_decide_request(&mut body, templates.iter().zip(checks.iter().map(|c| &c.key)));
        let expected = serde_json::to_vec(&DecideRequest { checks }).unwrap();
        prop_assert_eq!(String::from_utf8(body).unwrap(), String::from_utf8(expected).unwrap());
    }

    #[test]
    fn the_decision_record_is_byte_for_byte_what_serde_writes(
        lines in prop::collection::vec(
            (check(), 0..6usize, prop_oneof![Just(0u64), any::<u64>()], any::<bool>()),
            0..5,
        ),
    ) {
        const OUTCOMES: [RuleOutcome; 6] = [
            RuleOutcome::Allowed,
            RuleOutcome::Denied,
            RuleOutcome::ShadowDenied,
            RuleOutcome::CachedDeny,
            RuleOutcome::Skipped,
            RuleOutcome::Failed,
        ];
        let lines: Vec<RuleRecord<&RuleName, &str>> = lines
            .iter()
            .map(|(c, outcome, delay_ms, local)| RuleRecord {
                rule: &c.rule,
                key: c.key.as_str(),
                outcome: OUTCOMES[*outcome],
                delay_ms: *delay_ms,
                local: *local,
            })
            .collect();
        prop_assert_eq!(record::encode(lines.iter().cloned()), serde_json::to_vec(&lines).unwrap());
    }

    #[test]
    fn the_servers_answers_read_as_serde_reads_them(
        results in prop::collection::vec(verdict(), 0..6),
    ) {
        let body = serde_json::to_vec(&DecideResponse { results: results.clone() }).unwrap();
        prop_assert_eq!(read_canonical(&body), Some(results.clone()));
        prop_assert_eq!(read_decide_response(&body, results.len()).unwrap(), results);
    }

    #[test]
    fn no_text_reads_differently_from_serde(
        results in prop::collection::vec(verdict(), 1..3),
        cut in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        how in 0..3u8,
    ) {
        let body = mutated(serde_json::to_vec(&DecideResponse { results }).unwrap(), cut, byte, how);
        let serde = serde_json::from_slice::<DecideResponse>(&body).map(|r| r.results);
        if let Some(fast) = read_canonical(&body) {
            prop_assert_eq!(Some(fast), serde.ok());
        }
    }

    #[test]
    fn the_servers_answer_is_byte_for_byte_what_serde_writes(
        results in prop::collection::vec(verdict(), 0..6),
    ) {
        let mut body = Vec::new();
        write_decide_response(&mut body, &results);
        let expected = serde_json::to_vec(&DecideResponse { results }).unwrap();
        prop_assert_eq!(String::from_utf8(body).unwrap(), String::from_utf8(expected).unwrap());
    }

    #[test]
    fn the_filters_requests_read_as_serde_reads_them(
        checks in prop::collection::vec(check(), 0..6),
    ) {
        // Keys holding the two characters JSON escapes are left to serde.
        let plain = checks.iter().all(|c| !c.key.as_str().contains(['"', '\\']));
        let request = DecideRequest { checks };
        let body = serde_json::to_vec(&request).unwrap();
        prop_assert_eq!(read_canonical_request(&body), plain.then_some(request));
    }

    #[test]
    fn no_request_text_reads_differently_from_serde(
        checks in prop::collection::vec(check(), 1..3),
        cut in any::<prop::sample::Index>(),
        byte in prop_oneof![any::<u8>(), Just(b'\\'), Just(b'"'), Just(0x1f), Just(b'0'), Just(b' ')],
        how in 0..3u8,
    ) {
        let body = mutated(serde_json::to_vec(&DecideRequest { checks }).unwrap(), cut, byte, how);
        let serde = serde_json::from_slice::<DecideRequest>(&body);
        if let Some(fast) = read_canonical_request(&body) {
            prop_assert_eq!(Some(fast), serde.ok());
        }
    }
}
