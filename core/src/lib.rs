//! sluice-core: what the filter, the server and the simulator share.
//!
//! - [`limit`]: the six algorithms and their validated parameters.
//! - [`algorithm`]: pure reference models of those algorithms; the Lua scripts in `lua/` meet
//!   the same contract, and tests hold the two against each other on a real Redis.
//! - [`key`]: rule names, escaped limit keys, and the Redis keys they make.
//! - [`wire`]: protocol v1 between the filter and sluice-server.
//! - [`lease`]: lease mode, units handed to an Envoy ahead of need, and the bound it keeps.
//! - [`policy`]: the filter's configuration, parsed once into types that cannot hold a bad value,
//!   and the matching and key building that turn a request into checks.
//! - [`rls`]: Envoy's rate limit service configuration (the reference service's YAML), and
//!   requests planned on it.
//! - [`rlqs`]: what each bucket of Envoy's rate limit quota filter gets (`--rlqs-config`).
//! - [`throttle`]: warnings let through once an interval, with how many were left out.
//!
//! The crate does no I/O and reads no clock: callers pass the time in. It builds for
//! `wasm32-wasip1` (inside the filter) and for the host.
//!
//! ```
//! use sluice_core::algorithm::{Request, Update};
//! use sluice_core::limit::Limit;
//!
//! let limit: Limit = serde_json::from_str(
//!     r#"{"algorithm": "fixed_window", "limit": 2, "window": "1s"}"#).unwrap();
//! let mut state = None;
//! let mut allowed = Vec::new();
//! for _ in 0..3 {
//!     let out = limit.decide(state.as_ref(), Request::one_at(0));
//!     if let Update::Write { state: s, .. } = out.update { state = Some(s); }
//!     allowed.push(out.verdict.allowed);
//! }
//! assert_eq!(allowed, [true, true, false]);
//! ```

#![deny(missing_docs)]

pub mod algorithm;
pub mod decimal;
pub mod decision;
pub mod deny_cache;
pub mod duration;
pub mod file_error;
pub mod hex;
pub mod key;
pub mod lease;
pub mod limit;
pub mod policy;
pub mod record;
pub mod rlqs;
pub mod rls;
pub mod stat_names;
pub mod throttle;
pub mod verdict;
pub mod wire;
