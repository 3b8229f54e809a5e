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
