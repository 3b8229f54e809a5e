//! A primary, a replica and a sentinel watching them.

use std::time::Duration;

use crate::error::HarnessError;
use crate::server::{RedisServer, free_port, redis_cli};
use crate::wait::wait_until;

/// The name the sentinel knows the primary by.
pub const MASTER_NAME: &str = "sluice-primary";

/// A primary, its replica, and one sentinel (quorum 1) that fails over within seconds.
pub struct RedisSentinel {
    /// The primary at start.
    pub primary: RedisServer,
    /// Its replica.
    pub replica: RedisServer,
    sentinel: RedisServer,
}

impl RedisSentinel {
    /// Starts the three and waits until the sentinel knows the primary and the replica.
    pub fn start() -> Result<RedisSentinel, HarnessError> {
        let primary = RedisServer::start()?;
        let replica =
            RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port().to_string()])?;
        let dir = tempfile::Builder::new()
            .prefix("sluice-sentinel-")
            .tempdir()?;
        let port = free_port()?;
        let config = dir.path().join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {MASTER_NAME} 127.0.0.1 {} 1\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 1000\nsentinel failover-timeout {MASTER_NAME} 5000\n",
                dir.path().display(),
                primary.port()
            ),
        )?;
        let sentinel = RedisServer::start_config(dir, port, &config, &["--sentinel"])?;
        let found = RedisSentinel {
            primary,
            replica,
            sentinel,
        };
        found.wait("the sentinel knowing the replica", |s| {
            Ok(s.sentinel_cli(&["SENTINEL", "replicas", MASTER_NAME])?
                .contains(&found.replica.port().to_string()))
        })?;
        Ok(found)
    }

    /// The sentinel's URL.
    pub fn sentinel_url(&self) -> String {
        self.sentinel.url()
    }

    fn sentinel_cli(&self, args: &[&str]) -> Result<String, HarnessError> {
        redis_cli(self.sentinel.port(), args)
    }

    /// The port of the server the sentinel names as primary.
    pub fn primary_port(&self) -> Result<u16, HarnessError> {
        let reply = self.sentinel_cli(&["SENTINEL", "get-master-addr-by-name", MASTER_NAME])?;
        reply
            .lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .ok_or_else(|| HarnessError::Cluster(format!("sentinel said {reply:?}")))
    }

    /// Forces a failover and waits until the sentinel names the other server.
    pub fn fail_over(&self) -> Result<u16, HarnessError> {
        let before = self.primary_port()?;
        // The sentinel refuses (NOGOODSLAVE) until it has heard from the replica: ask again.
        self.wait("the sentinel taking the failover", |s| {
            Ok(s.sentinel_cli(&["SENTINEL", "FAILOVER", MASTER_NAME])?
                .trim()
                == "OK")
        })?;
        self.wait("the sentinel naming the other server", |s| {
            Ok(s.primary_port()? != before)
        })?;
        self.primary_port()
    }

    /// Polls `done` until it says true, for at most 30 s; an error counts as not yet (the
    /// sentinel refuses some questions until it knows the servers). `what` names the state.
    fn wait(
        &self,
        what: &str,
        done: impl Fn(&RedisSentinel) -> Result<bool, HarnessError>,
    ) -> Result<(), HarnessError> {
        wait_until(what, Duration::from_secs(30), || {
            Ok(done(self).unwrap_or(false))
        })
    }
}
