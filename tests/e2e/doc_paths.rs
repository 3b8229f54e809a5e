//! Every repository path the docs and code comments name exists: README.md, BENCHMARKS.md,
//! docs/, lua/, and the comments of the Rust sources. A path is a run of `A-Z a-z 0-9 _ . / -`
//! that starts with one of the repository's top directories; a renamed or split file leaves
//! its old name behind in prose, where nothing else would notice.

use std::path::{Path, PathBuf};

use crate::source_tree::{files_under, repository};

/// The repository's top directories that prose names paths under.
const ROOTS: [&str; 15] = [
    "bench",
    "core",
    "docs",
    "envoy",
    "examples",
    "filter",
    "filter-logic",
    "fuzz",
    "host",
    "lua",
    "module",
    "scripts",
    "server",
    "simulator",
    "tests",
];

/// The crates whose sources' comments are read.
const CRATES: [&str; 9] = [
    "bench",
    "core",
    "filter",
    "filter-logic",
    "host",
    "module",
    "server",
    "simulator",
    "tests",
];

/// The repository paths named in `text`.
fn paths_in(text: &str) -> Vec<&str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || "_./-".contains(c)))
        .map(|token| token.trim_end_matches(['.', '-']))
        .filter(|token| {
            ROOTS.iter().any(|root| {
                token
                    .strip_prefix(root)
                    .is_some_and(|rest| rest.starts_with('/'))
            })
        })
        .collect()
}

#[test]
fn every_path_the_docs_and_comments_name_exists() {
    let root = repository();
    let mut prose: Vec<PathBuf> = vec![root.join("README.md"), root.join("BENCHMARKS.md")];
    files_under(&root.join("docs"), ".md", None, &mut prose);
    files_under(&root.join("lua"), ".lua", None, &mut prose);
    let mut sources = Vec::new();
    for krate in CRATES {
        files_under(&root.join(krate), ".rs", None, &mut sources);
    }
    let mut missing = Vec::new();
    let mut named = 0;
    let mut check = |file: &Path, line_no: usize, line: &str| {
        for path in paths_in(line) {
            named += 1;
            // docs/fidelity.md names the simulator's files under host/src/, as it says.
            let relative_to_host =
                file.ends_with("docs/fidelity.md") && root.join("host/src").join(path).exists();
            if !root.join(path).exists() && !relative_to_host {
                let shown = file.strip_prefix(&root).unwrap_or(file).display();
                missing.push(format!("{shown}:{line_no}: {path}"));
            }
        }
    };
    for file in &prose {
        let text = std::fs::read_to_string(file).unwrap();
        for (i, line) in text.lines().enumerate() {
            check(file, i + 1, line);
        }
    }
    for file in &sources {
        let text = std::fs::read_to_string(file).unwrap();
        for (i, line) in text.lines().enumerate() {
            if let Some(at) = line.find("//") {
                check(file, i + 1, &line[at..]);
            }
        }
    }
    assert!(
        named > 100,
        "only {named} paths found: is the scan reading the files?"
    );
    assert!(
        missing.is_empty(),
        "paths named that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_path_is_read_out_of_prose_and_markup() {
    assert_eq!(
        paths_in("see `core/src/lease/mod.rs`, and (server/src/rlqs/{service,stream}.rs)."),
        ["core/src/lease/mod.rs", "server/src/rlqs/"]
    );
    assert_eq!(paths_in("the core of it, not core"), Vec::<&str>::new());
}
