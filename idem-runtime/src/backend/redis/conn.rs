//! One connection type for both Redis stores: a single server's `ConnectionManager` or a cluster's
//! connection, both cheap to clone (multiplexed).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::IdemError;

#[derive(Clone)]
pub(super) enum Conn {
    Single(Healing),
    Cluster(ClusterConnection),
}

/// A single server's `ConnectionManager` that is replaced when its connection stops answering.
///
/// The manager reconnects when its connection reports an error, but a half-open connection (the
/// server or a middlebox vanished without closing it, a network gone silent) reports nothing:
/// every request waits until it is given up. So:
///
/// - a request given up before its answer (its reply timed out, or its caller's store timeout
///   dropped it) has the connection probed: one `PING` at a time, which must answer within
///   [`PROBE_TIMEOUT`];
/// - a connection whose reply timed out or whose probe went unanswered is dead: every request
///   still waiting on it fails at once, and one new connection is dialled for everyone (one dial
///   in flight per store, its outcome shared by every caller that waits for it);
/// - a dial that fails fails every waiter at once with its cause, and the next request dials
///   afresh: requests never queue behind each other's dials.
#[derive(Clone)]
pub(super) struct Healing(Arc<HealingInner>);

/// A dial in flight: its outcome once known (`Err` saying why it failed).
type Dial = watch::Receiver<Option<Result<(), String>>>;

/// How long the probe of a connection that let a request go unanswered waits for its `PONG`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

struct HealingInner {
    client: redis::Client,
    config: ConnectionManagerConfig,
    /// `host:port`, for errors.
    addr: String,
    /// How long one dial may take.
    connect_timeout: Duration,
    /// The connection in use and its generation (bumped by each replacement).
    current: Mutex<(u64, ConnectionManager)>,
    /// Generations below this are dead: their waiting requests fail at once.
    dead_below: watch::Sender<u64>,
    /// The generation being probed, if any.
    probing: Mutex<Option<u64>>,
    /// The dial in flight, if any: its outcome, once known, for everyone waiting on it.
    dialing: Mutex<Option<Dial>>,
}

impl Healing {
    /// A manager on `client`, dialled once first so that an unreachable server fails at once with
    /// its address and cause (the manager itself retries a refused connection for seconds).
    pub(super) async fn connect(
        client: redis::Client,
        config: ConnectionManagerConfig,
        addr: String,
        connect_timeout: Duration,
    ) -> Result<Healing, IdemError> {
        let manager = dial(&client, &config, &addr, connect_timeout)
            .await
            .map_err(IdemError::unavailable)?;
        Ok(Healing(Arc::new(HealingInner {
            client,
            config,
            addr,
            connect_timeout,
            current: Mutex::new((0, manager)),
            dead_below: watch::Sender::new(0),
            probing: Mutex::new(None),
            dialing: Mutex::new(None),
        })))
    }

    fn current(&self) -> (u64, ConnectionManager) {
        let current = lock(&self.0.current);
        (current.0, current.1.clone())
    }

    /// The connection to send on: the current one, or, when it is dead, a new one (dialled by
    /// this request or by the one already dialling).
    async fn usable(&self) -> RedisResult<(u64, ConnectionManager)> {
        let (generation, conn) = self.current();
        if generation < *self.0.dead_below.borrow() {
            self.redial(generation).await.map_err(io_error)?;
            return Ok(self.current());
        }
        Ok((generation, conn))
    }

    /// Sends `request` on a usable connection; fails at once when that connection is found dead
    /// meanwhile; has it probed when the request is given up before its answer.
    async fn send<T>(
        &self,
        request: impl AsyncFnOnce(ConnectionManager) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let (generation, conn) = self.usable().await?;
        let mut dead = self.0.dead_below.subscribe();
        let mut watch = Unanswered {
            healing: self,
            generation,
            armed: true,
        };
        let result = tokio::select! {
            result = request(conn) => result,
            _ = dead.wait_for(|&below| generation < below) => Err(io_error(format!(
                "the connection to Redis at {} stopped answering; a new one is being dialled",
                self.0.addr
            ))),
        };
        watch.armed = false;
        if let Err(e) = &result
            && e.is_timeout()
        {
            self.found_dead(generation);
        }
        result
    }

    /// Generation `generation` stopped answering: every request on it fails now, and a new
    /// connection is dialled (unless one already is).
    fn found_dead(&self, generation: u64) {
        self.0.dead_below.send_if_modified(|below| {
            (*below <= generation)
                .then(|| *below = generation + 1)
                .is_some()
        });
        let healing = self.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = healing.redial(generation).await {
                    tracing::warn!(error = %e, "a Redis connection stopped answering and no new one could be made yet");
                }
            });
        }
    }

    /// Checks generation `generation` with one `PING` (one probe at a time): unanswered within
    /// [`PROBE_TIMEOUT`], it is dead.
    fn probe(&self, generation: u64) {
        {
            let mut probing = lock(&self.0.probing);
            if probing.is_some() || generation < *self.0.dead_below.borrow() {
                return;
            }
            *probing = Some(generation);
        }
        let healing = self.clone();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            *lock(&self.0.probing) = None;
            return;
        };
        runtime.spawn(async move {
            let (now, mut conn) = healing.current();
            let answered = now != generation
                || tokio::time::timeout(PROBE_TIMEOUT, redis::cmd("PING").query_async::<()>(&mut conn))
                    .await
                    .is_ok_and(|pong| pong.is_ok());
            *lock(&healing.0.probing) = None;
            if !answered {
                tracing::warn!(addr = %healing.0.addr, "a Redis connection did not answer a PING; replacing it");
                healing.found_dead(generation);
            }
        });
    }

    /// Replaces generation `dead` with a new connection, unless that was done already: joins the
    /// dial in flight or starts one (in a task of its own, so it ends whoever stops waiting).
    async fn redial(&self, dead: u64) -> Result<(), String> {
        let mut outcome = {
            let mut dialing = lock(&self.0.dialing);
            if self.current().0 != dead {
                return Ok(());
            }
            match &*dialing {
                Some(outcome) => outcome.clone(),
                None => {
                    let (tell, outcome) = watch::channel(None);
                    *dialing = Some(outcome.clone());
                    let healing = self.clone();
                    tokio::spawn(async move {
                        let inner = &healing.0;
                        let dialled = dial(
                            &inner.client,
                            &inner.config,
                            &inner.addr,
                            inner.connect_timeout,
                        )
                        .await;
                        let mut dialing = lock(&inner.dialing);
                        let told = match dialled {
                            Ok(fresh) => {
                                tracing::warn!(addr = %inner.addr, "replaced a Redis connection that stopped answering");
                                *lock(&inner.current) = (dead + 1, fresh);
                                Ok(())
                            }
                            Err(e) => Err(e),
                        };
                        *dialing = None;
                        drop(dialing);
                        tell.send_replace(Some(told));
                    });
                    outcome
                }
            }
        };
        let told = outcome.wait_for(Option::is_some).await;
        match told.as_deref() {
            Ok(Some(told)) => told.clone(),
            _ => Err(format!(
                "the dial to Redis at {} was abandoned",
                self.0.addr
            )),
        }
    }
}

/// A request under way: dropped before its answer (given up by its caller), it has its
/// connection probed.
struct Unanswered<'a> {
    healing: &'a Healing,
    generation: u64,
    armed: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.healing.probe(self.generation);
        }
    }
}

/// One connection attempt (no retries, within `timeout`), then the manager on the same client;
/// an error names `addr` and the cause.
async fn dial(
    client: &redis::Client,
    config: &ConnectionManagerConfig,
    addr: &str,
    timeout: Duration,
) -> Result<ConnectionManager, String> {
    let once = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    let first = tokio::time::timeout(
        timeout,
        client.get_multiplexed_async_connection_with_config(&once),
    );
    match first.await {
        Err(_) => {
            return Err(format!(
                "cannot reach Redis at {addr}: no answer within {timeout:?} (a network that drops \
                 packets, or a server that hangs)"
            ));
        }
        Ok(Err(e)) => return Err(format!("cannot reach Redis at {addr}: {e}")),
        Ok(Ok(probe)) => drop(probe),
    }
    let manager = ConnectionManager::new_with_config(client.clone(), config.clone());
    match tokio::time::timeout(timeout, manager).await {
        Ok(Ok(manager)) => Ok(manager),
        Ok(Err(e)) => Err(format!("cannot reach Redis at {addr}: {e}")),
        Err(_) => Err(format!(
            "cannot reach Redis at {addr}: no answer within {timeout:?}"
        )),
    }
}

/// An I/O error (so: unavailable, retryable) saying `why`.
fn io_error(why: String) -> redis::RedisError {
    std::io::Error::new(std::io::ErrorKind::TimedOut, why).into()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(h) => Box::pin(h.send(async move |mut c| c.req_packed_command(cmd).await)),
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
            Conn::Single(h) => Box::pin(
                h.send(async move |mut c| c.req_packed_commands(pipeline, offset, count).await),
            ),
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
                // WAIT counts what was written on the connection it is sent on, so it goes to
                // the node that took the write. That is the slot's owner, but for a write that a
                // slot migration redirected (`ASK`) to the receiving master: a script on the
                // record's key, routed (and redirected) as the write was, names the node.
                let taken_by: Option<String> =
                    TAKEN_BY.key(key).invoke_async(&mut c.clone()).await?;
                let routing = match taken_by.as_deref().and_then(host_port) {
                    Some((host, port)) => {
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port })
                    }
                    None => {
                        let route = Route::with_slot(Slot::for_key(key), SlotAddr::Master);
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route))
                    }
                };
                let value = c.clone().route_command(cmd, routing).await?;
                redis::from_redis_value(value).map_err(Into::into)
            }
        }
    }

    /// A SCAN for `pattern` to walk one reply (about 1,000 keys) at a time with [`Scan::next`]:
    /// on the server, or on every primary of a cluster in turn.
    pub(super) async fn scan(&self, pattern: &str) -> RedisResult<Scan> {
        Ok(Scan {
            pattern: pattern.to_owned(),
            nodes: self.scan_nodes().await?,
            cursor: 0,
        })
    }

    /// The nodes a walk of every key visits: the server (`None`), or the primaries of a cluster
    /// that `CLUSTER NODES` lists now as not failing, sorted by address (so two walks, in two
    /// processes, visit them in the same order).
    pub(super) async fn scan_nodes(&self) -> RedisResult<Vec<Option<Node>>> {
        match self {
            Conn::Single(_) => Ok(vec![None]),
            Conn::Cluster(c) => {
                let nodes: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query_async(&mut c.clone())
                    .await?;
                let mut nodes = primaries(&nodes);
                nodes.sort_unstable();
                nodes.dedup();
                Ok(nodes.into_iter().map(Some).collect())
            }
        }
    }

    /// One `SCAN cursor MATCH pattern COUNT count` on `node` (the server for `None`): the next
    /// cursor there (0 once the node was walked) and the reply's keys.
    pub(super) async fn scan_step(
        &self,
        node: Option<&Node>,
        cursor: u64,
        pattern: &str,
        count: usize,
    ) -> RedisResult<(u64, Vec<String>)> {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        self.on_node(cmd, node).await
    }

    /// The run id of `node` (the server for `None`): `INFO server`'s `run_id`, drawn anew each
    /// time the server process starts (`None` if the server gives none).
    pub(super) async fn run_id(&self, node: Option<&Node>) -> RedisResult<Option<String>> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("server");
        let info: String = self.on_node(cmd, node).await?;
        Ok(info
            .lines()
            .find_map(|line| line.strip_prefix("run_id:"))
            .map(|id| id.trim().to_owned()))
    }

    /// `cmd` sent to `node` of a cluster by its address (to the server for `None`).
    async fn on_node<T: redis::FromRedisValue>(
        &self,
        cmd: Cmd,
        node: Option<&Node>,
    ) -> RedisResult<T> {
        match self {
            Conn::Single(_) => cmd.query_async(&mut self.clone()).await,
            Conn::Cluster(c) => {
                let node = match node {
                    Some((host, port)) => SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port: *port,
                    },
                    None => SingleNodeRoutingInfo::Random,
                };
                let value = c
                    .clone()
                    .route_command(cmd, RoutingInfo::SingleNode(node))
                    .await?;
                Ok(redis::from_redis_value(value)?)
            }
        }
    }
}

/// A node of a cluster by its address: host and port.
pub(super) type Node = (String, u16);

/// A SCAN under way ([`Conn::scan`]): the nodes left to walk (the first one being walked) and its
/// cursor there.
pub(super) struct Scan {
    pattern: String,
    nodes: Vec<Option<Node>>,
    cursor: u64,
}

impl Scan {
    /// The next reply's keys (possibly none), or `None` once every node was walked.
    pub(super) async fn next(&mut self, conn: &Conn) -> RedisResult<Option<Vec<String>>> {
        let Some(node) = self.nodes.first() else {
            return Ok(None);
        };
        let (next, batch) = conn
            .scan_step(node.as_ref(), self.cursor, &self.pattern, 1000)
            .await?;
        if next == 0 {
            self.nodes.remove(0);
        }
        self.cursor = next;
        Ok(Some(batch))
    }
}

/// The address (`ip:port`) of the node a script on `KEYS[1]` runs on, from its own line of
/// `CLUSTER NODES` (`<id> <ip:port@bus[,hostname]> myself,…`); `nil` where it has none yet.
static TAKEN_BY: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r#"
for line in string.gmatch(redis.call('CLUSTER', 'NODES'), '[^\n]+') do
  local addr, flags = string.match(line, '^%S+ (%S+) (%S+)')
  if flags and string.find(flags, 'myself', 1, true) then
    return string.match(addr, '^[^@,]+')
  end
end
return nil
"#,
    )
});

/// `host:port` (an IPv6 host in brackets or not) split, when both parts are there.
fn host_port(addr: &str) -> Option<(String, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return None;
    }
    Some((host.to_owned(), port.parse().ok()?))
}

/// The primaries `CLUSTER NODES` lists that are not failing.
fn primaries(nodes: &str) -> Vec<Node> {
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
        found.push((host.to_owned(), port));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn a_nodes_address_splits_into_host_and_port() {
        assert_eq!(
            host_port("127.0.0.1:7000"),
            Some(("127.0.0.1".into(), 7000))
        );
        assert_eq!(host_port("[::1]:7001"), Some(("::1".into(), 7001)));
        // A node that has not met the others reports no host yet; a port must be a port.
        assert_eq!(host_port(":7000"), None);
        assert_eq!(host_port("127.0.0.1:x"), None);
        assert_eq!(host_port("127.0.0.1"), None);
    }
}
