use sluice_core::limit::Limit;
use sluice_core::verdict::Verdict;

use super::*;

#[test]
fn every_algorithm_has_its_own_script() {
    let hashes: std::collections::HashSet<&str> =
        SCRIPTS.all().map(|(_, s)| s.text().get_hash()).collect();
    assert_eq!(hashes.len(), 6);
}

#[test]
fn the_library_registers_every_script_under_a_name_of_its_own() {
    let library = SCRIPTS.library();
    assert!(
        library
            .code
            .starts_with(&format!("#!lua name={}\n", library.name))
    );
    let functions: std::collections::HashSet<&str> = SCRIPTS
        .all()
        .map(|(_, s)| s.function())
        .chain([SCRIPTS.batch().function(), SCRIPTS.lease().function()])
        .collect();
    assert_eq!(functions.len(), 8);
    for function in functions {
        assert!(
            function.starts_with(&format!("{}_", library.name)),
            "{function}"
        );
        assert!(
            library
                .code
                .contains(&format!("redis.register_function('{function}', ")),
            "{function} is not registered"
        );
    }
}

#[test]
fn arguments_follow_the_single_script_contract() {
    let limit: Limit = serde_json::from_str(
        r#"{"algorithm":"leaky_bucket","rate":5,"per":"2s","burst":7,"mode":"shaping","max_wait":"250ms"}"#,
    )
    .unwrap();
    // 5 per 2 s: 400000 us per unit, one tick per microsecond.
    let call = ScriptCall::new(&limit, "k".into(), ScriptTime::Replay(42), 3, true);
    assert_eq!(
        written(&call.args()),
        ["r42", "3", "1", "1", "400000", "1", "7", "250000"]
    );
    let call = ScriptCall::new(&limit, "k".into(), ScriptTime::Redis, 1, false).asking();
    assert_eq!(written(&call.args())[..4], ["", "1", "0", "0"]);
    let call = ScriptCall::new(&limit, "k".into(), ScriptTime::Carried(9), 1, false);
    assert_eq!(written(&call.args())[0], "9");
    assert_eq!(
        call.args()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        written(&call.args()),
        "displayed as written"
    );
}

/// The arguments as they go into the command.
fn written(args: &[ScriptArg]) -> Vec<String> {
    let cmd = LimitScript::fcall(SCRIPTS.get(Algorithm::Gcra), &[], args);
    cmd.args_iter()
        .skip(3)
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => String::from_utf8(bytes.to_vec()).unwrap(),
            other => panic!("not a plain argument: {other:?}"),
        })
        .collect()
}

#[test]
fn arguments_follow_the_batch_script_contract() {
    let window: Limit =
        serde_json::from_str(r#"{"algorithm":"fixed_window","limit":5,"window":"1m"}"#).unwrap();
    let gcra: Limit =
        serde_json::from_str(r#"{"algorithm":"gcra","rate":49,"per":"1s","burst":4}"#).unwrap();
    let at = ScriptTime::Replay(7);
    let batch = BatchCall::new(
        at,
        vec![
            (ScriptCall::new(&window, "a".into(), at, 1, false), false),
            (ScriptCall::new(&gcra, "b".into(), at, 2, true), true),
        ],
    );
    assert_eq!(batch.keys, ["a", "b"]);
    assert_eq!(
        written(&batch.args),
        [
            "r7", "2", // time, checks
            "1", "1", "0", "0", "2", "5", "60000000", // fixed_window
            "6", "2", "1", "1", "3", "1000000", "49", "4", // gcra
        ]
    );
}

#[test]
fn replies_are_checked() {
    let reply = |text: &str| redis::Value::BulkString(text.as_bytes().to_vec());
    assert_eq!(
        decode_reply(&reply("0 10 0 500 -1 0")),
        Ok(Verdict {
            allowed: false,
            limit: 10,
            remaining: 0,
            reset_ms: 500,
            retry_after_ms: None,
            delay_ms: 0
        })
    );
    for bad in [
        reply("1 2 3"),
        reply("1 2 3 4 5 6 7"),
        reply(""),
        reply("2 1 1 1 1 1"),
        reply("1 1 1 1 -1 0"),
        reply("0 -5 0 0 0 0"),
        reply("0 10 0 500 -1 0 "),
        reply("0 10 0 5e2 -1 0"),
        reply("0 10 0 99999999999999999999 -1 0"),
        redis::Value::Array(vec![redis::Value::Int(1); 6]),
        redis::Value::Nil,
    ] {
        assert!(decode_reply(&bad).is_err(), "{bad:?}");
    }
    let batch = BatchCall {
        keys: vec!["a".into(), "b".into()],
        args: Vec::new(),
    };
    let verdicts = batch.decode(&reply("1 5 4 0 0 0 0 3 0 20 20 0")).unwrap();
    assert_eq!(
        verdicts.iter().map(|v| v.allowed).collect::<Vec<_>>(),
        [true, false]
    );
    assert!(batch.decode(&reply("1 5 4 0 0 0")).is_err());
}
