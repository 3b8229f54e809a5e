//! The parsers that read what others send — the filter's configuration, the server's answers,
//! the filter's requests, an allowance or a denial in shared data — on arbitrary bytes and on JSON built
//! from their own vocabulary: they may refuse, they never panic. (The same targets run under
//! libFuzzer in `fuzz/`.)

#![allow(clippy::unwrap_used)] // test code

use proptest::prelude::*;
use serde_json::Value;
use sluice_core::deny_cache::{Entry, EntryId, SlotKeys, entry_id};
use sluice_core::duration::Millis;
use sluice_core::key::{LimitKey, RuleName};
use sluice_core::lease::{Allowance, LeaseConfig, LeaseTerms};
use sluice_core::policy::{HttpRequest, Policy};
use sluice_core::wire::{DecideRequest, LeaseGrant, LeaseRequest};

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
        Just("count_denied"),
        Just("lease"),
        Just("horizon"),
        Just("max_share"),
        Just("max_total_share"),
        Just("ttl"),
        Just("holder"),
        Just("asks"),
        Just("terms"),
        Just("max_units"),
        Just("max_outstanding"),
        Just("want"),
        Just("held"),
        Just("returning"),
        Just("demand"),
        Just("grants"),
        Just("granted"),
        Just("lease_ms"),
        Just("more_in_ms"),
        Just("remaining"),
        Just("pace_us"),
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

/// A lease ask the answer parser checks answers against.
const LEASE_REQUEST: &[u8] = br#"{"holder":"envoy-1","asks":[{"rule":"a","key":"k","limit":{"algorithm":"gcra","rate":100,"per":"1s","burst":100},"terms":{"max_units":10,"max_outstanding":50,"ttl":"1s"},"want":10}]}"#;

/// An allowance as shared data may hold it: the twelve numbers and the id, each anything.
fn any_slot() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        // An allowance's record: its tag, twelve numbers, an id.
        (prop::collection::vec(any::<u64>(), 12), ".{0,8}").prop_map(|(numbers, id)| {
            let mut record = vec![0xA1];
            for n in numbers {
                record.extend_from_slice(&n.to_le_bytes());
            }
            record.extend_from_slice(id.as_bytes());
            record
        }),
    ]
}

fn any_grant() -> impl Strategy<Value = LeaseGrant> {
    (prop::array::uniform6(any::<u64>()), any::<Option<u64>>()).prop_map(
        |([granted, lease_ms, more_in_ms, limit, remaining, pace_us], kept)| LeaseGrant {
            granted,
            lease_ms,
            more_in_ms,
            limit,
            remaining,
            pace_us,
            kept,
            share_per_ks: 0,
            crowded: false,
        },
    )
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
                headers: [(":path".into(), path.clone().into()), (":method".into(), b"GET".as_slice().into()), ("x-forwarded-for".into(), path.into())].into_iter().collect(),
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

    #[test]
    fn the_lease_request_parser_never_panics(data in any_input()) {
        let _ = LeaseRequest::from_json(&data);
    }

    #[test]
    fn the_lease_answer_parser_never_panics(data in any_input()) {
        let request = LeaseRequest::from_json(LEASE_REQUEST).unwrap();
        let _ = request.parse_response(&data);
    }

    /// Whatever shared data holds and whatever the clock says, an allowance's every step
    /// runs, and what it writes back reads back the same.
    #[test]
    fn an_allowance_runs_on_any_slot_and_any_grant(
        slot in any_slot(),
        grant in any_grant(),
        [asked_at_us, now_us, ttl_us, margin_us] in prop::array::uniform4(any::<u64>()),
        cost in 0u64..1_000_000,
        horizon_ms in 1u64..=60_000,
        max_units in any::<u64>(),
    ) {
        let mut allowance = Allowance::decode(&slot).unwrap_or_else(|| Allowance::new("r:k"));
        let config = LeaseConfig {
            horizon: Millis::new(horizon_ms).unwrap(),
            terms: LeaseTerms { max_units, max_outstanding: max_units, ttl: Millis::new(horizon_ms * 2).unwrap() },
        };
        allowance.grant(asked_at_us, &grant);
        allowance.observe(cost, now_us, config.horizon);
        let _ = allowance.want(now_us, &config);
        let _ = allowance.take(cost, now_us);
        let _ = allowance.give_back(cost, now_us);
        let _ = allowance.demand_per_second(config.horizon);
        let _ = allowance.lease_ending(now_us, ttl_us, margin_us);
        prop_assert_eq!(Allowance::decode(&allowance.encode()), Some(allowance));
    }

    /// Whatever a deny cache slot holds (a VM of another build of the filter shares the slots
    /// while Envoy swaps configurations), it is read without a panic, and the lookup's
    /// shortcut finds exactly what a full reading finds that denies this check now: the entry
    /// written for it, not one for a key that only starts or ends like it.
    #[test]
    fn a_deny_cache_slot_is_read_alike_by_the_lookup_and_in_full(
        rule in "[a-z][a-z0-9_.-]{0,8}",
        parts in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..6), 1..3),
        [until_ms, reset_at_ms, limit, now_ms] in prop::array::uniform4(0u64..4_000),
        written_as in 0u8..4,
        junk in prop::collection::vec(any::<u8>(), 0..24),
    ) {
        let rule = RuleName::new(rule).unwrap();
        let key = LimitKey::from_parts(parts.iter().map(Vec::as_slice));
        let id = EntryId::new(&rule, &key);
        let own = entry_id(&rule, &key);
        prop_assert!(id.is(&own));
        let keys = SlotKeys::new("f", 64);
        prop_assert_eq!(keys.key_of(id), keys.key(&own));

        let other = String::from_utf8_lossy(&junk);
        let written = match written_as {
            0 => own.clone(),
            1 => format!("{own}{other}"),
            2 => format!("{other}{own}"),
            _ => own[..own.len() - junk.len() % own.len() - 1].to_owned() + &other,
        };
        let slot = if written_as == 3 && junk.len() % 2 == 1 {
            junk.clone()
        } else {
            Entry { id: written, until_ms, reset_at_ms, limit }.encode()
        };
        let in_full = Entry::decode(&slot).filter(|e| now_ms < e.until_ms && e.id == own);
        prop_assert_eq!(Entry::decode_denying(&slot, id, now_ms), in_full);
    }
}
