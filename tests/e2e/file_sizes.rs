//! No source file's code runs past 500 lines (its test module, last in the file, not counted):
//! a file that long holds more than one idea, and is split where the ideas part. The rule is
//! for the product's crates and the bench; the test crates (`tests/`) are test code.

use crate::import_circles::{CRATE_SOURCES, code_of};
use crate::source_tree::{files_under, repository};

/// The most lines of code a source file holds.
const MAX_LINES: usize = 500;

#[test]
fn no_source_file_runs_past_500_lines() {
    let repository = repository();
    let mut files = Vec::new();
    for dir in CRATE_SOURCES.iter().filter(|d| !d.starts_with("tests/")) {
        files_under(&repository.join(dir), ".rs", None, &mut files);
    }
    files.retain(|file| file.file_name().is_some_and(|n| n != "tests.rs"));
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
