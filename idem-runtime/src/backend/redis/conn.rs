//! One connection type for both Redis stores: a single server's `ConnectionManager` or a cluster's
//! connection, both cheap to clone (multiplexed).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

#[derive(Clone)]
pub(super) enum Conn {
    Single(Healing),
    Cluster(ClusterConnection),
}

/// A single server's `ConnectionManager` that is replaced when a reply times out.
///
/// The manager reconnects when its connection reports an error, but a half-open connection (the
/// server or a middlebox vanished without closing it) reports nothing: every request waits for
/// its response timeout, forever. A timed-out reply therefore dials a new connection for the
/// requests that follow (once per dead connection, however many requests timed out on it).
#[derive(Clone)]
pub(super) struct Healing(Arc<HealingInner>);

struct HealingInner {
    client: redis::Client,
    config: ConnectionManagerConfig,
    /// The connection in use and its generation (bumped by each replacement).
    current: Mutex<(u64, ConnectionManager)>,
    redial: tokio::sync::Mutex<()>,
}

impl Healing {
    pub(super) async fn connect(
        client: redis::Client,
        config: ConnectionManagerConfig,
    ) -> RedisResult<Healing> {
        let manager = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
        Ok(Healing(Arc::new(HealingInner {
            client,
            config,
            current: Mutex::new((0, manager)),
            redial: tokio::sync::Mutex::new(()),
        })))
    }

    fn current(&self) -> (u64, ConnectionManager) {
        let current = self.0.current.lock().unwrap_or_else(|e| e.into_inner());
        (current.0, current.1.clone())
    }

    /// Replaces generation `timed_out` after one of its replies timed out (unless another request
    /// already did); keeps it when a new connection cannot be made yet.
    async fn heal(&self, timed_out: u64) {
        let _one_at_a_time = self.0.redial.lock().await;
        if self.current().0 != timed_out {
            return;
        }
        match ConnectionManager::new_with_config(self.0.client.clone(), self.0.config.clone()).await
        {
            Ok(fresh) => {
                tracing::warn!("a Redis reply timed out; replaced the connection");
                *self.0.current.lock().unwrap_or_else(|e| e.into_inner()) = (timed_out + 1, fresh);
            }
            Err(e) => {
                tracing::warn!(error = %e, "a Redis reply timed out and no new connection could be made yet");
            }
        }
    }

    async fn after<T>(&self, generation: u64, result: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &result
            && e.is_timeout()
        {
            self.heal(generation).await;
        }
        result
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(h) => Box::pin(async move {
                let (generation, mut c) = h.current();
                let result = c.req_packed_command(cmd).await;
                h.after(generation, result).await
            }),
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
            Conn::Single(h) => Box::pin(async move {
                let (generation, mut c) = h.current();
                let result = c.req_packed_commands(pipeline, offset, count).await;
                h.after(generation, result).await
            }),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(h) => h.current().1.get_db(),
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
            Conn::Single(_) => cmd.query_async(&mut self.clone()).await,
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
        let mut scan = self.scan(pattern).await?;
        let mut keys = Vec::new();
        while let Some(batch) = scan.next(self).await? {
            keys.extend(batch);
        }
        Ok(keys)
    }

    /// A SCAN for `pattern` to walk one reply (about 1,000 keys) at a time with [`Scan::next`]:
    /// on the server, or on every primary of a cluster in turn.
    pub(super) async fn scan(&self, pattern: &str) -> RedisResult<Scan> {
        let nodes = match self {
            Conn::Single(_) => vec![None],
            Conn::Cluster(c) => {
                let nodes: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query_async(&mut c.clone())
                    .await?;
                primaries(&nodes).into_iter().map(Some).collect()
            }
        };
        Ok(Scan {
            pattern: pattern.to_owned(),
            nodes,
            cursor: 0,
        })
    }
}

/// A SCAN under way ([`Conn::scan`]): the nodes left to walk (the first one being walked) and its
/// cursor there.
pub(super) struct Scan {
    pattern: String,
    nodes: Vec<Option<SingleNodeRoutingInfo>>,
    cursor: u64,
}

impl Scan {
    /// The next reply's keys (possibly none), or `None` once every node was walked.
    pub(super) async fn next(&mut self, conn: &Conn) -> RedisResult<Option<Vec<String>>> {
        let Some(node) = self.nodes.first().cloned() else {
            return Ok(None);
        };
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(self.cursor)
            .arg("MATCH")
            .arg(&self.pattern)
            .arg("COUNT")
            .arg(1000);
        let (next, batch): (u64, Vec<String>) = match conn {
            Conn::Single(_) => conn.clone().route(cmd, node).await?,
            Conn::Cluster(c) => c.clone().route(cmd, node).await?,
        };
        if next == 0 {
            self.nodes.remove(0);
        }
        self.cursor = next;
        Ok(Some(batch))
    }
}

/// The primaries `CLUSTER NODES` lists that are not failing.
fn primaries(nodes: &str) -> Vec<SingleNodeRoutingInfo> {
    let mut found = Vec::new();
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
        found.push(SingleNodeRoutingInfo::ByAddress {
            host: host.to_owned(),
            port,
        });
    }
    found
}

/// Sending a command to one node of a cluster (or to the one server).
trait RouteTo {
    async fn route(
        &mut self,
        cmd: Cmd,
        node: Option<SingleNodeRoutingInfo>,
    ) -> RedisResult<(u64, Vec<String>)>;
}

impl RouteTo for Conn {
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
