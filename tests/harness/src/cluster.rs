//! A three-node Redis Cluster on loopback.

use std::time::{Duration, Instant};

use crate::HarnessError;
use crate::server::{RedisServer, free_port, redis_cli};
use crate::tls::TlsFiles;

/// Three primaries, no replicas, every slot assigned; stopped on drop.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// With [`RedisCluster::start_tls`], each node's TLS port.
    tls_ports: Vec<u16>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers and joins them with `redis-cli --cluster create`.
    pub fn start() -> Result<RedisCluster, HarnessError> {
        RedisCluster::start_nodes(None)
    }

    /// As [`RedisCluster::start`], the nodes speaking TLS to one another and announcing their
    /// TLS ports to clients that come by TLS (`tls-cluster yes`); each keeps a plain port.
    pub fn start_tls(files: &TlsFiles) -> Result<RedisCluster, HarnessError> {
        RedisCluster::start_nodes(Some(files))
    }

    fn start_nodes(tls: Option<&TlsFiles>) -> Result<RedisCluster, HarnessError> {
        let mut nodes = Vec::new();
        let mut tls_ports = Vec::new();
        for i in 0..3 {
            let mut args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &format!("nodes-{i}.conf"),
                "--cluster-node-timeout",
                "5000",
            ]
            .map(str::to_owned)
            .to_vec();
            if let Some(files) = tls {
                let port = free_port()?;
                tls_ports.push(port);
                args.extend(["--tls-port".to_owned(), port.to_string()]);
                args.extend(files.server_args());
                args.extend(
                    ["--tls-cluster", "yes", "--tls-replication", "yes"].map(str::to_owned),
                );
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            nodes.push(RedisServer::start_with(&args)?);
        }
        let ports = if tls.is_some() {
            tls_ports.clone()
        } else {
            nodes.iter().map(RedisServer::port).collect()
        };
        let mut args = Vec::new();
        if let Some(files) = tls {
            args.push("--tls".to_owned());
            args.extend(files.client_args());
        }
        args.extend(["--cluster", "create"].map(str::to_owned));
        args.extend(ports.iter().map(|port| format!("127.0.0.1:{port}")));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"].map(str::to_owned));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = redis_cli(ports[0], &args)?;
        if !output.contains("All 16384 slots covered") {
            return Err(HarnessError::Cluster(format!(
                "`redis-cli --cluster create` said:\n{output}"
            )));
        }
        let cluster = RedisCluster { nodes, tls_ports };
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

    /// With [`RedisCluster::start_tls`], the nodes' TLS URLs, `rediss://127.0.0.1:<port>`.
    pub fn tls_urls(&self) -> Vec<String> {
        self.tls_ports
            .iter()
            .map(|port| format!("rediss://127.0.0.1:{port}"))
            .collect()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }
}
