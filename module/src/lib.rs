//! sluice-module: sluice's HTTP filter as a native Envoy dynamic module
//! (`envoy.filters.http.dynamic_modules`), configured with the very JSON policy the .wasm
//! takes.
//!
//! The request's logic is `sluice-filter-logic`'s, the .wasm's own; this crate is the glue:
//! [`abi`] (the ABI, from Envoy 1.40's `abi.h`), [`envoy`] (safe handles on Envoy's objects),
//! [`hooks`] (what Envoy calls), [`config`] and [`stream`]. Headers are read in place and
//! every worker shares the configuration, the deny cache and the leases' allowances in
//! process memory; [`lease`] asks for allowances from the configuration's callouts and
//! scheduler on the main thread, never from a request.

pub mod abi;
mod cache;
mod clock;
mod config;
mod envoy;
mod hold;
pub mod hooks;
pub mod lease;
mod spares;
mod stream;
