//! A three-node Redis Cluster on loopback.

use std::time::{Duration, Instant};

use crate::HarnessError;
use crate::server::{RedisServer, redis_cli};

/// Three primaries, no replicas, every slot assigned; stopped on drop.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers and joins them with `redis-cli --cluster create`.
    pub fn start() -> Result<RedisCluster, HarnessError> {
        let mut nodes = Vec::new();
        for i in 0..3 {
            let config_file = format!("nodes-{i}.conf");
            nodes.push(RedisServer::start_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &config_file,
                "--cluster-node-timeout",
                "5000",
            ])?);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let output = redis_cli(nodes[0].port(), &args)?;
        if !output.contains("All 16384 slots covered") {
            return Err(HarnessError::Cluster(format!(
                "`redis-cli --cluster create` said:\n{output}"
            )));
        }
        let cluster = RedisCluster { nodes };
        cluster.wait_until_ok()?;
        Ok(cluster)
    }

    fn wait_until_ok(&self) -> Result<(), HarnessError> {
        let started = Instant::now();
        loop {
            let mut all_ok = true;
            for node in &self.nodes {
                all_ok &= node.cli(&["CLUSTER", "INFO"])?.contains("cluster_state:ok");
            }
            if all_ok {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(20) {
                return Err(HarnessError::Cluster(
                    "cluster_state never became ok".to_owned(),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The nodes' URLs, `redis://127.0.0.1:<port>`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }
}
