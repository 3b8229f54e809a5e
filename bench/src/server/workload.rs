//! What every side of the server benchmark is measured on: the limit, the keys, how the server
//! waits, and what stands in its place.

/// A limit that always admits, so every decision writes.
pub(crate) const LIMIT: &str = r#"{"algorithm":"gcra","rate":1000000,"per":"1s","burst":1000000}"#;
/// Distinct client keys.
pub(super) const KEYSPACE: u64 = 10_000;
/// How long sluice-server (and the floor) poll after each Redis call instead of sleeping
/// (`--busy-poll-us`): longer than Redis takes over the several calls that reach it in one
/// write here (nine or so, 8 µs each) and its own wake-up, so that under load a poll seldom
/// runs out before the answers come. 50 µs ran out in those waits: at 16 connections a few runs
/// fell to 0.79 of `EVALSHA`, where 200 kept to 0.88 .. 0.93 (two invocations side by side,
/// 2026-11-26, 5 s runs).
pub(crate) const BUSY_POLL_US: u64 = 200;

/// A server measured in sluice-server's place, under the same load, in the same rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standin {
    /// sluice-server as it runs by default: sleeping whenever it waits (no `--busy-poll-us`).
    Sleeping,
    /// The floor (`bench/examples/floor.rs`), polling as sluice-server does.
    Floor,
}

impl Standin {
    /// Every stand-in, in the order they are reported.
    pub const ALL: [Standin; 2] = [Standin::Sleeping, Standin::Floor];
}
