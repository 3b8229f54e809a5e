//! Why configuration files were refused, for the configurations validated from several files
//! at once (Envoy's rate limit service, the quota service).

use std::fmt;

/// A file that does not validate: which of the files given (0-based), the path in it, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    /// Which of the files given, from 0.
    pub file: usize,
    /// The path in it, as `descriptors[0].rate_limit.unit`; empty for the file as a whole.
    pub path: String,
    /// Why.
    pub reason: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.reason)
        } else {
            write!(f, "{}: {}", self.path, self.reason)
        }
    }
}

impl std::error::Error for FileError {}
