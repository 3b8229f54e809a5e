//! The repository's files, as the tests that hold its prose and code to house rules read them.

use std::path::{Path, PathBuf};

/// The repository's root.
pub fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every file under `dir` whose name ends with `suffix`, but under a `target` directory or
/// under `skip`.
pub fn files_under(dir: &Path, suffix: &str, skip: Option<&Path>, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if Some(path.as_path()) == skip {
            continue;
        }
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                files_under(&path, suffix, skip, found);
            }
        } else if path.to_string_lossy().ends_with(suffix) {
            found.push(path);
        }
    }
}

/// The directories whose crates are scanned: each `src` holds a library or binary root, and
/// each `src/bin/<name>/main.rs` a binary of its own.
pub const CRATE_SOURCES: [&str; 13] = [
    "bench/noop/src",
    "bench/noop-module/src",
    "bench/src",
    "core/src",
    "filter/src",
    "filter-logic/src",
    "host/src",
    "module/src",
    "server/src",
    "simulator/src",
    "tests/src",
    "tests/harness/src",
    "tests/probe/src",
];

/// The Rust sources under `dir` (but under `skip`) that are not test modules of their own
/// (`tests.rs`).
pub fn rust_sources(dir: &Path, skip: Option<&Path>) -> Vec<PathBuf> {
    let mut found = Vec::new();
    files_under(dir, ".rs", skip, &mut found);
    found.retain(|file| file.file_name().is_some_and(|n| n != "tests.rs"));
    found
}

/// The source that counts: no test module from `#[cfg(test)] mod` on (last in a file, by this
/// repository's habit), no comments; a line for each line before it.
pub fn code_of(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut code = String::with_capacity(text.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            let next = lines[i + 1..]
                .iter()
                .map(|l| l.trim_start())
                .find(|l| !l.is_empty());
            if next.is_some_and(|l| l.starts_with("mod ") || l.starts_with("pub mod ")) {
                break;
            }
        }
        code.push_str(line.split("//").next().unwrap_or(""));
        code.push('\n');
    }
    code
}
