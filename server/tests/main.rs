//! The server's integration tests, one module a file, built as one test binary: each of them
//! links the server, its Redis client and tonic, and twelve binaries took twelve links and a
//! third of a gigabyte of disk.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a broken expectation is a failed test
#![allow(clippy::disallowed_methods)] // tests time what they wait for on the wall clock

mod algorithms;
mod all_or_nothing;
mod binary;
mod cluster;
mod cluster_changes;
mod common;
mod differential;
mod http;
mod lease;
mod lua_arithmetic;
mod network;
mod redis_access;
mod redis_cell;
mod resilience;
mod rlqs;
mod rls;
mod tls;
mod unfit_redis;
mod worst_case;
