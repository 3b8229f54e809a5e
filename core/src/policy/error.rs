//! What a bad policy is told: the path of the offending field and why.

use std::fmt;

/// A configuration error: the path of the offending field and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    /// Where, as `rules[2].limit.rate`; empty for the document itself.
    pub path: String,
    /// Why.
    pub message: String,
}

impl PolicyError {
    pub(crate) fn new(path: &str, message: impl Into<String>) -> PolicyError {
        PolicyError {
            path: path.to_owned(),
            message: message.into(),
        }
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "configuration: {}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for PolicyError {}

pub(crate) fn field(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}
