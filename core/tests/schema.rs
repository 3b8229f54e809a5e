//! docs/config.schema.json is the JSON Schema of the filter's configuration, generated from the
//! types that parse it; this test fails when the two drift apart. Regenerate with
//! `SLUICE_BLESS=1 cargo test -p sluice-core --test schema` (or `make schema`).

#![allow(clippy::unwrap_used)] // test code

use std::path::Path;

use sluice_core::policy::raw::RawPolicy;

#[test]
fn the_committed_schema_is_the_one_the_types_generate() {
    let mut schema = schemars::schema_for!(RawPolicy);
    schema.insert(
        "$id".to_owned(),
        "https://sluice.dev/schemas/config.schema.json".into(),
    );
    schema.insert("title".to_owned(), "sluice filter configuration".into());
    let generated = serde_json::to_string_pretty(&schema).unwrap() + "\n";
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/config.schema.json");
    if std::env::var_os("SLUICE_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/config.schema.json is out of date: run `make schema`"
    );
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)).unwrap()
}

/// Every ```json block of docs/config.md, with the line it starts on.
fn documented_configurations() -> Vec<(usize, String)> {
    let doc = read("../docs/config.md");
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in doc.lines().enumerate() {
        match (&mut current, line.trim()) {
            (None, "```json") => current = Some((i + 1, String::new())),
            (Some(_), "```") => blocks.push(current.take().unwrap()),
            (Some((_, text)), _) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn every_documented_configuration_passes_the_schema_and_the_parser() {
    let schema: serde_json::Value =
        serde_json::from_str(&read("../docs/config.schema.json")).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let mut examples = documented_configurations();
    assert!(
        examples.len() >= 10,
        "docs/config.md lost its examples: {}",
        examples.len()
    );
    examples.push((0, read("../examples/policy.json")));
    for (line, text) in examples {
        let value: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("docs/config.md:{line}: {e}"));
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "docs/config.md:{line} fails the schema: {errors:?}"
        );
        if let Err(e) = sluice_core::policy::Policy::from_json(text.as_bytes()) {
            panic!("docs/config.md:{line} is refused by the parser: {e}");
        }
    }
}

#[test]
fn the_schema_refuses_what_the_parser_refuses_for_the_common_mistakes() {
    let schema: serde_json::Value =
        serde_json::from_str(&read("../docs/config.schema.json")).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for bad in [
        r#"{"rules": []}"#,
        r#"{"cluster": "s", "rules": [], "colour": 1}"#,
        r#"{"cluster": "s", "rules": [{"name": "a b", "key": ["client_ip"], "limit": {"algorithm": "gcra", "rate": 1, "per": "1s", "burst": 1}}]}"#,
        r#"{"cluster": "s", "rules": [{"name": "r", "key": ["client_ip"], "limit": {"algorithm": "leaky", "rate": 1, "per": "1s", "burst": 1}}]}"#,
        r#"{"cluster": "s", "rules": [{"name": "r", "key": ["client_ip"], "limit": {"algorithm": "gcra", "rate": 0, "per": "1s", "burst": 1}}]}"#,
        r#"{"cluster": "s", "rules": [{"name": "r", "key": ["client_ip"], "limit": {"algorithm": "gcra", "rate": 1, "per": "1 s", "burst": 1}}]}"#,
        r#"{"cluster": "s", "failure_mode": "maybe", "rules": []}"#,
    ] {
        let value: serde_json::Value = serde_json::from_str(bad).unwrap();
        assert!(!validator.is_valid(&value), "the schema accepts {bad}");
        assert!(
            sluice_core::policy::Policy::from_json(bad.as_bytes()).is_err(),
            "the parser accepts {bad}"
        );
    }
}
