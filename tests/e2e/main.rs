//! The end-to-end tests, one module a file, built as one test binary: every one of them links
//! the simulator and wasmtime, and as nine binaries they took nearly half a gigabyte of disk
//! and nine links of it.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a broken expectation is a failed test
#![allow(clippy::disallowed_methods)] // tests time what they wait for on the wall clock

mod doc_paths;
mod end_to_end;
mod envoy_config;
mod fidelity;
mod file_sizes;
mod filter;
mod host_loading;
mod import_circles;
mod in_envoy;
mod lease;
mod rlqs_protocol;
mod rls_reference;
mod robustness;
mod simulator;
mod source_tree;
