//! sluice-filter-logic: what sluice's two Envoy filters share, the proxy-wasm filter
//! (`filter/`) and the native dynamic module (`module/`), with no host in it.
//!
//! A filter hands each request to a [`Request`], which finds its checks, decides those its
//! leases and its deny cache can, writes the one callout's body for the rest, and concludes
//! from the verdicts: continue, hold (shaping) or reply. What only a host can do, the clock,
//! counters, the deny cache's and the leases' storage, the decision's filter state, is the
//! [`Glue`] each filter implements. Everything decidable without a host at all lives in
//! `sluice-core`.

#![deny(missing_docs)]

pub mod answer;
pub mod cas;
mod glue;
pub mod lease;
mod read;
mod request;
pub mod shared_data;

pub use glue::{Glue, Local};
pub use read::{callout_headers, read_request, read_request_into};
pub use request::{Act, Repeating, Repeats, Request, Start};
