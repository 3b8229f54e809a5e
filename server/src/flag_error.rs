//! Why the flags make no server. A leaf: the modules that check a flag's value (certificates,
//! topology, TLS) name the flag at fault without depending on the configuration that calls them.

use sluice_core::duration::Millis;

/// Why the flags make no server: the flag at fault, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FlagError {
    /// A flag's value is refused, or it does not go with the others.
    #[error("{flag}: {reason}")]
    Refused {
        /// The flag, as `--redis-password`.
        flag: &'static str,
        /// Why.
        reason: String,
    },
    /// `--request-timeout` would cut off a request while Redis may still answer it.
    #[error(
        "--request-timeout ({request}) must be longer than --redis-timeout ({redis}): a request \
         waiting on Redis would be cut off before Redis could answer it"
    )]
    RequestTimeout {
        /// `--request-timeout`.
        request: Millis,
        /// `--redis-timeout`.
        redis: Millis,
    },
}

impl FlagError {
    pub(crate) fn new(flag: &'static str, reason: impl Into<String>) -> FlagError {
        FlagError::Refused {
            flag,
            reason: reason.into(),
        }
    }
}
