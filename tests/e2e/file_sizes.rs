//! No source file's code runs past 500 lines (its test module, last in the file, not counted):
//! a file that long holds more than one idea, and is split where the ideas part. The rule is
//! for the product's crates and the bench; the test crates (`tests/`) are test code.

use crate::source_tree::{CRATE_SOURCES, code_of, repository, rust_sources};

/// The most lines of code a source file holds.
const MAX_LINES: usize = 500;

#[test]
fn no_source_file_runs_past_500_lines() {
    let repository = repository();
    let files: Vec<_> = CRATE_SOURCES
        .iter()
        .filter(|d| !d.starts_with("tests/"))
        .flat_map(|dir| rust_sources(&repository.join(dir), None))
        .collect();
    assert!(files.len() > 200, "only {} files read", files.len());
    let mut long: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let lines = code_of(&std::fs::read_to_string(file).unwrap())
                .lines()
                .count();
            let shown = file.strip_prefix(&repository).unwrap_or(file).display();
            (lines > MAX_LINES).then(|| format!("{shown}: {lines} lines"))
        })
        .collect();
    long.sort();
    assert!(
        long.is_empty(),
        "files past {MAX_LINES} lines of code:\n{}",
        long.join("\n")
    );
}
