//! One connection type for both Redis stores: a single server's `ConnectionManager` or a cluster's
//! connection, both cheap to clone (multiplexed).

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use std::time::Duration;

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// `WAIT replicas timeout` on the connection that wrote `key` (a cluster: its slot's primary),
    /// giving how many replicas acknowledged its writes.
    pub(super) async fn wait_for_replicas(
        &self,
        key: &str,
        replicas: u32,
        timeout: Duration,
    ) -> RedisResult<i64> {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(replicas).arg(
            u64::try_from(timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        );
        match self {
            Conn::Single(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => {
                let route = Route::with_slot(Slot::for_key(key), SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                let value = c.clone().route_command(cmd, routing).await?;
                redis::from_redis_value(value).map_err(Into::into)
            }
        }
    }

    /// Every key matching `pattern`: SCAN on the server, or on every primary of a cluster.
    pub(super) async fn scan_keys(&self, pattern: &str) -> RedisResult<Vec<String>> {
        match self {
            Conn::Single(c) => scan(&mut c.clone(), pattern, None).await,
            Conn::Cluster(c) => {
                let mut conn = c.clone();
                let nodes: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query_async(&mut conn)
                    .await?;
                let mut keys = Vec::new();
                for line in nodes.lines() {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    let (Some(addr), Some(flags)) = (fields.get(1), fields.get(2)) else {
                        continue;
                    };
                    if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                        continue;
                    }
                    let addr = addr.split('@').next().unwrap_or(addr);
                    let Some((host, port)) = addr.rsplit_once(':') else {
                        continue;
                    };
                    let Ok(port) = port.parse() else { continue };
                    let node = SingleNodeRoutingInfo::ByAddress {
                        host: host.to_owned(),
                        port,
                    };
                    keys.extend(scan(&mut conn, pattern, Some(node)).await?);
                }
                Ok(keys)
            }
        }
    }
}

async fn scan(
    conn: &mut (impl ConnectionLike + RouteTo),
    pattern: &str,
    node: Option<SingleNodeRoutingInfo>,
) -> RedisResult<Vec<String>> {
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000);
        let (next, batch): (u64, Vec<String>) = conn.route(cmd, node.clone()).await?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// Sending a command to one node of a cluster (or to the one server).
trait RouteTo {
    async fn route(
        &mut self,
        cmd: Cmd,
        node: Option<SingleNodeRoutingInfo>,
    ) -> RedisResult<(u64, Vec<String>)>;
}

impl RouteTo for ConnectionManager {
    async fn route(
        &mut self,
        cmd: Cmd,
        _node: Option<SingleNodeRoutingInfo>,
    ) -> RedisResult<(u64, Vec<String>)> {
        cmd.query_async(self).await
    }
}

impl RouteTo for ClusterConnection {
    async fn route(
        &mut self,
        cmd: Cmd,
        node: Option<SingleNodeRoutingInfo>,
    ) -> RedisResult<(u64, Vec<String>)> {
        let routing = RoutingInfo::SingleNode(node.unwrap_or(SingleNodeRoutingInfo::Random));
        let value = self.route_command(cmd, routing).await?;
        Ok(redis::from_redis_value(value)?)
    }
}
