//! A 3-master Redis Cluster a test starts itself from the installed `redis-server` (three loopback
//! ports, no persistence) and stops when dropped. Include it beside `support/redis_server.rs`:
//! `#[path = "…/redis_server.rs"] mod redis_server;`.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

use crate::redis_server::{self, RedisServer};

/// Three masters on loopback ports picked from the process id (so concurrent runs do not meet),
/// without persistence.
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
    dir: PathBuf,
}

impl Cluster {
    /// Starts the nodes and joins them into a cluster; `None` (with one line) when `redis-server`
    /// is not installed, unless IDEM_REQUIRE_SERVICES=1.
    pub fn start() -> Option<Cluster> {
        Self::start_with(0, &[])
    }

    /// Three masters and a replica of each (six nodes, the replicas of nodes 0–2 being 3–5 in
    /// some order: [`Cluster::master_of`]), each with `extra` settings.
    pub fn start_with_replicas(extra: &[&str]) -> Option<Cluster> {
        Self::start_with(1, extra)
    }

    fn start_with(replicas: u16, extra: &[&str]) -> Option<Cluster> {
        if !redis_server::installed() {
            return None;
        }
        let dir = redis_server::scratch_dir("cluster");
        let base = if replicas == 0 { 12_000 } else { 13_000 };
        let nodes: Vec<RedisServer> = redis_server::ports(base, 3 * (1 + replicas))
            .map(|port| {
                let conf = format!("nodes-{port}.conf");
                RedisServer::start(
                    port,
                    &dir,
                    &["--cluster-enabled", "yes", "--cluster-config-file", &conf]
                        .into_iter()
                        .chain(["--save", "", "--appendonly", "no"])
                        .chain(extra.iter().copied())
                        .collect::<Vec<_>>(),
                )
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(
            created.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        let cluster = Cluster { nodes, dir };
        cluster.wait_ok();
        Some(cluster)
    }

    pub fn wait_ok(&self) {
        for node in &self.nodes {
            node.wait_for(
                |info| info.contains("cluster_state:ok"),
                &["CLUSTER", "INFO"],
            );
        }
    }

    /// This node's id in the cluster.
    pub fn id(&self, node: usize) -> String {
        self.nodes[node].cli(&["CLUSTER", "MYID"]).trim().to_owned()
    }

    /// The node (by index) `node` replicates, if it is a replica.
    pub fn master_of(&self, node: usize) -> Option<usize> {
        let info = self.nodes[node].cli(&["INFO", "replication"]);
        let port: u16 = info
            .lines()
            .find_map(|l| l.strip_prefix("master_port:"))?
            .trim()
            .parse()
            .ok()?;
        self.nodes.iter().position(|n| n.port == port)
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Stops a node without saving and starts it again: its data is gone (no persistence).
    pub fn restart(&self, node: usize) {
        self.nodes[node].shutdown_nosave();
        self.nodes[node].start_again();
        self.wait_ok();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
