//! A three-primary Redis Cluster on loopback, with a replica for each primary if asked; and
//! what an operator does to one: move a slot, lose a primary.

use std::time::Duration;

use crate::error::HarnessError;
use crate::proxy::ForwardingProxy;
use crate::server::{RedisServer, free_port, ping, redis_cli};
use crate::tls::TlsFiles;
use crate::wait::wait_until;

/// How long a node may stay silent before the others count it as failed, in a cluster with
/// replicas: short, so that a test sees a failover within seconds.
const FAILOVER_NODE_TIMEOUT_MS: &str = "1000";

/// A node's cluster bus port over its client port (Redis' default; the nodes here keep it).
const BUS_PORT_OFFSET: u16 = 10000;

/// Three primaries (and with [`RedisCluster::start_with_replicas`] a replica of each), every
/// slot assigned; stopped on drop.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// With [`RedisCluster::start_tls`], each node's TLS port.
    tls_ports: Vec<u16>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers and joins them with `redis-cli --cluster create`.
    pub fn start() -> Result<RedisCluster, HarnessError> {
        RedisCluster::start_nodes(None, 0, &[])
    }

    /// Six servers, each also given `node_args`: three primaries and a replica of each, which
    /// takes over within about two seconds when its primary stops answering. Which node is
    /// which is the cluster's choice: ask [`RedisCluster::owner_of_slot`].
    pub fn start_with_replicas(node_args: &[&str]) -> Result<RedisCluster, HarnessError> {
        RedisCluster::start_nodes(None, 1, node_args)
    }

    /// As [`RedisCluster::start`], the nodes speaking TLS to one another and announcing their
    /// TLS ports to clients that come by TLS (`tls-cluster yes`); each keeps a plain port.
    pub fn start_tls(files: &TlsFiles) -> Result<RedisCluster, HarnessError> {
        RedisCluster::start_nodes(Some(files), 0, &[])
    }

    fn start_nodes(
        tls: Option<&TlsFiles>,
        replicas: usize,
        node_args: &[&str],
    ) -> Result<RedisCluster, HarnessError> {
        let mut nodes = Vec::new();
        let mut tls_ports = Vec::new();
        let node_timeout = if replicas > 0 {
            FAILOVER_NODE_TIMEOUT_MS
        } else {
            "5000"
        };
        for i in 0..3 * (1 + replicas) {
            let mut args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &format!("nodes-{i}.conf"),
                "--cluster-node-timeout",
                node_timeout,
            ]
            .map(str::to_owned)
            .to_vec();
            args.extend(node_args.iter().map(|&arg| arg.to_owned()));
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
        args.extend(["--cluster-replicas".to_owned(), replicas.to_string()]);
        args.push("--cluster-yes".to_owned());
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

    /// Waits until every running node says `cluster_state:ok` and every replica has its
    /// primary's data.
    fn wait_until_ok(&self) -> Result<(), HarnessError> {
        self.wait_for("cluster_state ok and every replica in sync", |cluster| {
            for node in cluster.running_nodes() {
                let replication = node.cli(&["INFO", "replication"])?;
                if !node.cli(&["CLUSTER", "INFO"])?.contains("cluster_state:ok")
                    || (replication.contains("role:slave")
                        && !replication.contains("master_link_status:up"))
                {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }

    /// Polls `done` until it says true, for at most 20 s; `what` names it in the error.
    fn wait_for(
        &self,
        what: &str,
        done: impl Fn(&RedisCluster) -> Result<bool, HarnessError>,
    ) -> Result<(), HarnessError> {
        wait_until(what, Duration::from_secs(20), || done(self))
    }

    /// The index in [`RedisCluster::nodes`] of the primary that serves `slot`, as a running
    /// node sees it.
    pub fn owner_of_slot(&self, slot: u16) -> Result<usize, HarnessError> {
        self.slot_owners()?
            .owner(slot)
            .ok_or_else(|| HarnessError::Cluster(format!("no node serves slot {slot}")))
    }

    /// Which primary serves which slots, as a running node sees them now (`CLUSTER NODES`).
    pub fn slot_owners(&self) -> Result<SlotOwners, HarnessError> {
        let view = self.running()?.cli(&["CLUSTER", "NODES"])?;
        let mut ranges = Vec::new();
        for line in view.lines() {
            // Known by its bus port, which is its own port's plus 10000 whatever port it
            // announces (see `RedisCluster::announce_port`).
            let owner = line
                .split_whitespace()
                .nth(1)
                .and_then(|address| address.split(['@', ',']).nth(1)?.parse::<u16>().ok())
                .and_then(|bus| self.index_of_port(bus.checked_sub(BUS_PORT_OFFSET)?))
                .ok_or_else(|| HarnessError::Cluster(format!("a node we did not start: {line}")))?;
            ranges.extend(slots_of(line).map(|(first, last)| (first, last, owner)));
        }
        Ok(SlotOwners(ranges))
    }

    /// Makes node `index` announce `port` for clients to reach it by, as a node behind NAT or
    /// a proxy does (`cluster-announce-port`), and waits until every running node names it so.
    fn announce_port(&self, index: usize, port: u16) -> Result<(), HarnessError> {
        let port = port.to_string();
        self.nodes[index].cli(&["CONFIG", "SET", "cluster-announce-port", &port])?;
        let id = self.id(index)?;
        let announced = format!(":{port}@");
        self.wait_for("every node naming the announced port", |cluster| {
            for node in cluster.running_nodes() {
                let view = node.cli(&["CLUSTER", "NODES"])?;
                let line = view.lines().find(|line| line.starts_with(&id));
                if !line.is_some_and(|line| line.contains(&announced)) {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }

    /// Makes clients reach node `index` through `proxy` alone (forwarding to it): the node
    /// announces the proxy's port, and the URLs returned, for a client to start from, are the
    /// other nodes'.
    pub fn reached_through(
        &self,
        index: usize,
        proxy: &ForwardingProxy,
    ) -> Result<Vec<String>, HarnessError> {
        self.announce_port(index, proxy.addr().port())?;
        let mut others = self.urls();
        others.remove(index);
        Ok(others)
    }

    /// Node `index`'s cluster id (`CLUSTER MYID`).
    pub fn id(&self, index: usize) -> Result<String, HarnessError> {
        Ok(self.nodes[index]
            .cli(&["CLUSTER", "MYID"])?
            .trim()
            .to_owned())
    }

    /// Kills node `index` as a crash would, and waits until another node serves each slot it
    /// served: its replica, elected by the other primaries. Returns that node's index.
    pub fn crash_and_fail_over(&mut self, index: usize) -> Result<usize, HarnessError> {
        let served = self
            .slot_owners()?
            .0
            .into_iter()
            .find(|&(.., owner)| owner == index);
        let Some((slot, ..)) = served else {
            return Err(HarnessError::Cluster(format!(
                "node {index} is not a primary: there is nothing to fail over"
            )));
        };
        self.nodes[index].kill();
        self.wait_for("a replica serving the crashed primary's slots", |cluster| {
            Ok(cluster
                .owner_of_slot(slot)
                .is_ok_and(|owner| owner != index)
                && cluster.running_nodes().all(|node| {
                    node.cli(&["CLUSTER", "INFO"])
                        .is_ok_and(|info| info.contains("cluster_state:ok"))
                }))
        })?;
        self.owner_of_slot(slot)
    }

    /// Starts moving `slot` to node `to`, as `redis-cli --cluster reshard` does a slot at a
    /// time: the target imports it and its owner migrates it, both still serving it. Clients
    /// meet `ASK` for the slot's keys once they have moved, until [`SlotMove::finish`].
    pub fn begin_slot_move(&self, slot: u16, to: usize) -> Result<SlotMove<'_>, HarnessError> {
        let from = self.owner_of_slot(slot)?;
        let slot_text = slot.to_string();
        let (from_id, to_id) = (self.id(from)?, self.id(to)?);
        for (node, state, peer) in [(to, "IMPORTING", &from_id), (from, "MIGRATING", &to_id)] {
            expect_ok(
                &self.nodes[node].cli(&["CLUSTER", "SETSLOT", &slot_text, state, peer])?,
                "CLUSTER SETSLOT",
            )?;
        }
        Ok(SlotMove {
            cluster: self,
            slot,
            from,
            to,
        })
    }

    /// Moves `slots` slots from node `from` to node `to` with `redis-cli --cluster reshard`,
    /// as an operator would; returns what it said.
    pub fn reshard(&self, from: usize, to: usize, slots: u16) -> Result<String, HarnessError> {
        let (from_id, to_id) = (self.id(from)?, self.id(to)?);
        let address = format!("127.0.0.1:{}", self.nodes[from].port());
        let slots = slots.to_string();
        let said = self.nodes[from].cli(&[
            "--cluster",
            "reshard",
            &address,
            "--cluster-from",
            &from_id,
            "--cluster-to",
            &to_id,
            "--cluster-slots",
            &slots,
            "--cluster-yes",
        ])?;
        if !said.contains("Moving slot") || said.contains("[ERR]") {
            return Err(HarnessError::Cluster(format!(
                "`redis-cli --cluster reshard` said:\n{said}"
            )));
        }
        self.wait_until_ok()?;
        Ok(said)
    }

    /// The first node that answers.
    fn running(&self) -> Result<&RedisServer, HarnessError> {
        self.running_nodes()
            .next()
            .ok_or_else(|| HarnessError::Cluster("no node is running".to_owned()))
    }

    fn running_nodes(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|node| ping(node.addr()))
    }

    fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes
            .iter()
            .position(|node| node.port() == port)
            .or_else(|| self.tls_ports.iter().position(|&p| p == port))
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

/// A slot on its way from one primary to another ([`RedisCluster::begin_slot_move`]).
pub struct SlotMove<'a> {
    cluster: &'a RedisCluster,
    slot: u16,
    from: usize,
    to: usize,
}

impl SlotMove<'_> {
    /// Moves every key of the slot to the target (`MIGRATE`): from now on its old owner
    /// answers `ASK` for them. Returns how many keys moved.
    pub fn migrate_keys(&self) -> Result<usize, HarnessError> {
        let from = &self.cluster.nodes[self.from];
        let keys = from.cli(&["CLUSTER", "GETKEYSINSLOT", &self.slot.to_string(), "1000"])?;
        let keys: Vec<&str> = keys
            .lines()
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .collect();
        self.migrate(&keys)?;
        Ok(keys.len())
    }

    /// Moves `keys`, of the slot, to the target in one `MIGRATE`, as `redis-cli --cluster
    /// reshard` moves a batch (by default 10 keys; two keys of one script may be in different
    /// batches).
    pub fn migrate(&self, keys: &[&str]) -> Result<(), HarnessError> {
        if keys.is_empty() {
            return Ok(());
        }
        let port = self.cluster.nodes[self.to].port().to_string();
        let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        migrate.extend(keys);
        expect_ok(&self.cluster.nodes[self.from].cli(&migrate)?, "MIGRATE")
    }

    /// Gives the slot to the target on every node, the target first (as Redis' manual says),
    /// so that no node sends a client back to the old owner.
    pub fn finish(self) -> Result<(), HarnessError> {
        let to_id = self.cluster.id(self.to)?;
        let slot = self.slot.to_string();
        let order = [self.to, self.from]
            .into_iter()
            .chain((0..self.cluster.nodes.len()).filter(|&i| i != self.to && i != self.from));
        for index in order {
            let node = &self.cluster.nodes[index];
            if ping(node.addr()) {
                expect_ok(
                    &node.cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id])?,
                    "CLUSTER SETSLOT NODE",
                )?;
            }
        }
        let cluster = self.cluster;
        cluster.wait_for("every node agreeing on the moved slot", |cluster| {
            Ok(cluster.running_nodes().all(|node| {
                node.cli(&["CLUSTER", "NODES"]).is_ok_and(|view| {
                    view.lines().any(|line| {
                        line.starts_with(&to_id)
                            && slots_of(line).any(|(a, b)| (a..=b).contains(&self.slot))
                    })
                })
            }))
        })
    }
}

/// Which primary serves which slots, at one moment ([`RedisCluster::slot_owners`]).
#[derive(Debug, Clone)]
pub struct SlotOwners(Vec<(u16, u16, usize)>);

impl SlotOwners {
    /// The index in [`RedisCluster::nodes`] of the primary that served `slot`.
    pub fn owner(&self, slot: u16) -> Option<usize> {
        self.0
            .iter()
            .find(|&&(first, last, _)| (first..=last).contains(&slot))
            .map(|&(.., owner)| owner)
    }

    /// The primary that served `key`'s slot.
    pub fn owner_of_key(&self, key: &str) -> Option<usize> {
        self.owner(key_slot(key))
    }
}

/// The Cluster slot of `key` ([`sluice_core::key::cluster_slot`]).
pub fn key_slot(key: &str) -> u16 {
    sluice_core::key::cluster_slot(key.as_bytes())
}

/// The slot ranges on a `CLUSTER NODES` line (a slot being imported or migrated, in brackets,
/// is not one of them).
fn slots_of(line: &str) -> impl Iterator<Item = (u16, u16)> + '_ {
    line.split_whitespace().skip(8).filter_map(|range| {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        Some((first.parse().ok()?, last.parse().ok()?))
    })
}

fn expect_ok(said: &str, command: &str) -> Result<(), HarnessError> {
    if said.trim() == "OK" {
        Ok(())
    } else {
        Err(HarnessError::Cluster(format!("{command} said {said:?}")))
    }
}
