//! A network that goes silent and stays silent: every call answers within its store timeout.
//!
//! Between the service and its store (Postgres, MariaDB, Redis) stands a proxy that stops
//! forwarding bytes without closing anything, the way a dropped network, a dead NAT entry or a
//! hung load balancer looks to a client. While it is silent, on each server store:
//!
//! - a body that ran and is being marked (a held mark), a new call, a replay and 64 calls
//!   released together each end with a retryable `StoreUnavailable` within 2 s when the store
//!   timeout is 1 s, and within the default store timeout (plus 2 s) when none is set;
//! - no body runs for a call whose claim had no answer (audited by the bodies' own log);
//! - a reconciler's pass ends the same way within its store timeout;
//!
//! and once the network is back, the same store answers normally: new keys run, the replay
//! replays, 64 calls at once succeed, so no connection was left broken by the silence. The
//! network comes back in two ways: with what it held delivered late (a partition that healed),
//! or with every connection open during the silence dead for good while new ones work (a NAT
//! entry or a load balancer's flow table lost): a connection the store gave up on must then
//! never be handed out or tested again.
//!
//! Also: connecting to a refused port fails in under a second naming `host:port`, and to a
//! silent server within the connect timeout.

#![cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]

#[path = "contract/server.rs"]
mod server;

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::{Call, IdemError, Store};
use idem_storm::Proxy;
use idem_suite::doc_table::{SharedRows, Table, secs};
use tokio::sync::{Barrier, Notify};

/// The store timeout the calls set.
const TIMEOUT: Duration = Duration::from_secs(1);
/// How long any call may take when its store timeout is 1 s.
const BOUND: Duration = Duration::from_secs(2);
/// Calls released together.
const BURST: usize = 64;

/// The `host:port` a store URL names, resolved.
fn upstream(url: &str) -> SocketAddr {
    let rest = url.split("://").nth(1).unwrap();
    let host = rest
        .rsplit('@')
        .next()
        .unwrap()
        .split(['/', '?'])
        .next()
        .unwrap();
    host.to_socket_addrs().unwrap().next().unwrap()
}

/// The bodies that ran, per key: the business's own log, not idem's counters.
#[derive(Clone, Default)]
struct Effects(Arc<Mutex<HashMap<String, u32>>>);

impl Effects {
    fn ran(&self, key: &str) {
        *self.0.lock().unwrap().entry(key.to_owned()).or_default() += 1;
    }

    fn count(&self, key: &str) -> u32 {
        self.0.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

/// One call on `store` for `key` whose body logs its effect; its result and how long it took.
async fn call(
    store: &dyn Store,
    effects: &Effects,
    key: &str,
    timeout: Option<Duration>,
) -> (Result<String, IdemError>, Duration) {
    let mut call = Call::new("SILENT", key);
    if let Some(timeout) = timeout {
        call = call.store_timeout(timeout);
    }
    let started = Instant::now();
    let out = call
        .run(store, async {
            effects.ran(key);
            Ok::<_, IdemError>(format!("done {key}"))
        })
        .await;
    (out, started.elapsed())
}

/// A retryable "the store did not answer" within `bound`.
fn unanswered(what: &str, out: &Result<String, IdemError>, took: Duration, bound: Duration) {
    match out {
        Err(e @ IdemError::StoreUnavailable { .. }) => assert!(e.is_retryable(), "{what}: {e}"),
        other => panic!("{what}: expected StoreUnavailable, got {other:?}"),
    }
    assert!(
        took <= bound,
        "{what} answered after {took:?}, more than {bound:?}"
    );
}

/// How the network comes back.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Back {
    /// What was held is delivered, late.
    Held,
    /// Connections open during the silence stay dead for good; new ones work.
    NewOnly,
}

/// The whole scenario on the store `idem::connect` opens from `url` through the proxy.
async fn silence_never_heals(name: &str, url: &str, back: Back) {
    let upstream_addr = upstream(url);
    let proxy = Proxy::start(upstream_addr).await.unwrap();
    let proxied = proxy.url(url, upstream_addr);
    let Some(store) = server::reach(name, url, idem::connect(&proxied)).await else {
        return;
    };
    store.migrate().await.unwrap();
    let effects = Effects::default();
    let run = server::unique("run");
    let key = |what: &str| format!("{run}-{what}");

    // Before: a key done, to be replayed while silent; and a burst, so the store holds as many
    // connections as a busy service's (each of them is then cut off mid-statement).
    let (out, _) = call(&store, &effects, &key("replay"), Some(TIMEOUT)).await;
    assert_eq!(out.unwrap(), format!("done {}", key("replay")));
    burst_succeeds(name, &store, &effects, &key("before")).await;

    // A held mark: the body is running when the network goes silent.
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let held = {
        let (store, started, release) = (store.clone(), started.clone(), release.clone());
        let (effects, held_key) = (effects.clone(), key("held"));
        tokio::spawn(async move {
            let out = Call::new("SILENT", &held_key)
                .store_timeout(TIMEOUT)
                .run(&store, async {
                    started.notify_one();
                    release.notified().await;
                    effects.ran(&held_key);
                    Ok::<_, IdemError>("held".to_owned())
                })
                .await;
            (out, Instant::now())
        })
    };
    started.notified().await;
    proxy.silence();
    let released = Instant::now();
    release.notify_one();
    let (out, ended) = held.await.unwrap();
    let held_took = ended - released;
    unanswered(&format!("{name}: the held mark"), &out, held_took, BOUND);
    assert_eq!(
        effects.count(&key("held")),
        1,
        "{name}: the held body ran once"
    );

    // While silent: a new call, a replay, a burst.
    let (out, new_took) = call(&store, &effects, &key("new"), Some(TIMEOUT)).await;
    unanswered(&format!("{name}: a new call"), &out, new_took, BOUND);
    assert_eq!(effects.count(&key("new")), 0, "{name}: no claim, no body");
    let (out, replay_took) = call(&store, &effects, &key("replay"), Some(TIMEOUT)).await;
    unanswered(&format!("{name}: a replay"), &out, replay_took, BOUND);

    let barrier = Arc::new(Barrier::new(BURST));
    let burst: Vec<_> = (0..BURST)
        .map(|i| {
            let (store, effects, barrier) = (store.clone(), effects.clone(), barrier.clone());
            let key = key(&format!("burst-{i}"));
            tokio::spawn(async move {
                barrier.wait().await;
                call(&store, &effects, &key, Some(TIMEOUT)).await
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for (i, task) in burst.into_iter().enumerate() {
        let (out, took) = task.await.unwrap();
        slowest = slowest.max(took);
        unanswered(&format!("{name}: burst call {i}"), &out, took, BOUND);
        assert_eq!(
            effects.count(&key(&format!("burst-{i}"))),
            0,
            "{name}: burst {i} ran"
        );
    }

    // The reconciler's pass too (its own store timeout).
    let reconciler = idem::Reconciler::new(store.clone(), 100)
        .recover("SILENT", |_key: String| async {
            Ok::<Option<String>, IdemError>(None)
        })
        .unwrap()
        .store_timeout(TIMEOUT)
        .unwrap();
    let started = Instant::now();
    let pass = reconciler.reconcile_once().await;
    let took = started.elapsed();
    assert!(
        matches!(pass, Err(IdemError::StoreUnavailable { .. })),
        "{name}: the reconciler's pass: {pass:?}"
    );
    assert!(
        took <= BOUND,
        "{name}: the reconciler's pass answered after {took:?}"
    );

    let mut default_took = None;
    if back == Back::Held {
        // With the default store timeout (in this variant only: Redis's own reply timeout, as
        // long, would find the dead connection there too, and the other variant proves that a
        // call's store timeout alone does).
        let (out, took) = call(&store, &effects, &key("default"), None).await;
        let bound = idem::store::DEFAULT_STORE_TIMEOUT + BOUND - TIMEOUT;
        unanswered(
            &format!("{name}: a call with the default timeout"),
            &out,
            took,
            bound,
        );
        default_took = Some(took);
        let least = idem::store::DEFAULT_STORE_TIMEOUT - Duration::from_millis(50);
        assert!(
            took >= least,
            "{name}: the default timeout ended after {took:?}"
        );
    }

    // The network comes back: the same store answers, on connections that work.
    match back {
        Back::Held => proxy.heal(),
        Back::NewOnly => proxy.heal_new_only(),
    }
    // A dial begun during the silence may still be waiting for its connect timeout: the first
    // answer may take that long, no longer.
    let healed = Instant::now();
    let grace = idem::connect::DEFAULT_CONNECT_TIMEOUT + BOUND;
    let first_answer;
    loop {
        let (out, _) = call(&store, &effects, &key("replay"), Some(TIMEOUT)).await;
        match out {
            Ok(value) => {
                assert_eq!(
                    value,
                    format!("done {}", key("replay")),
                    "{name}: replay after"
                );
                first_answer = healed.elapsed();
                break;
            }
            Err(e) if healed.elapsed() < grace => {
                assert!(e.is_retryable(), "{name}: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{name}: no answer {grace:?} after the network came back: {e}"),
        }
    }
    for i in 0..8 {
        let k = key(&format!("after-{i}"));
        let (out, _) = call(&store, &effects, &k, Some(TIMEOUT)).await;
        assert_eq!(out.unwrap(), format!("done {k}"), "{name}: a new key after");
    }
    burst_succeeds(name, &store, &effects, &key("after")).await;
    eprintln!(
        "{name}, network back {back:?}: held mark {held_took:.2?}, new call {new_took:.2?}, \
         replay {replay_took:.2?}, slowest of {BURST} at once {slowest:.2?}, default timeout \
         {default_took:.2?}; first answer {first_answer:.2?} after the network came back"
    );
    let order = ["Postgres", "MariaDB", "Redis"]
        .iter()
        .position(|n| *n == name)
        .unwrap_or(9);
    let (back_order, back_said) = match back {
        Back::Held => (0, "late replies delivered"),
        Back::NewOnly => (1, "old connections dead"),
    };
    Table::new(
        "silent-network",
        &[
            "store",
            "network back",
            "held mark",
            "new call",
            "replay",
            "slowest of 64 at once",
            "default timeout",
            "first answer after the network came back",
        ],
    )
    .emit_shared(
        &FIGURES,
        &format!("{order} {back_order}"),
        [
            name.to_owned(),
            back_said.to_owned(),
            secs(held_took),
            secs(new_took),
            secs(replay_took),
            secs(slowest),
            default_took.map_or("–".to_owned(), secs),
            secs(first_answer),
        ],
    );
}

/// Every scenario's figures, one row each, for docs/RELIABILITY.md (`tests/reliability.sh`).
static FIGURES: SharedRows = SharedRows::new();

/// 64 calls released together, each for a key of its own under `prefix`: all run once.
async fn burst_succeeds(name: &str, store: &idem::AnyStore, effects: &Effects, prefix: &str) {
    let barrier = Arc::new(Barrier::new(BURST));
    let burst: Vec<_> = (0..BURST)
        .map(|i| {
            let (store, effects, barrier) = (store.clone(), effects.clone(), barrier.clone());
            let key = format!("{prefix}-{i}");
            tokio::spawn(async move {
                barrier.wait().await;
                (
                    call(&store, &effects, &key, Some(Duration::from_secs(10))).await,
                    key,
                )
            })
        })
        .collect();
    for task in burst {
        let ((out, _), k) = task.await.unwrap();
        assert_eq!(out.unwrap(), format!("done {k}"), "{name}: a burst call");
        assert_eq!(effects.count(&k), 1, "{name}: {k} ran once");
    }
}

/// Connecting: a refused port fails at once naming it; a silent server within the timeout.
async fn connect_fails_fast(name: &str, url: &str) {
    let upstream_addr = upstream(url);
    if server::reach(name, url, async {
        std::net::TcpStream::connect_timeout(&upstream_addr, Duration::from_secs(2))
    })
    .await
    .is_none()
    {
        return;
    }
    // A port nothing listens on: bind one, note it, close it.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let refused = url.replacen(&upstream_addr.to_string(), &closed.to_string(), 1);
    let started = Instant::now();
    let Err(e) = idem::connect(&refused).await else {
        panic!("{name}: a refused port was reached")
    };
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "{name}: refused after {took:?}: {e}"
    );
    let text = e.to_string();
    assert!(text.contains(&closed.to_string()), "{name}: {text}");
    assert!(text.to_lowercase().contains("refused"), "{name}: {text}");
    assert!(
        matches!(e, IdemError::StoreUnavailable { .. }),
        "{name}: {e:?}"
    );

    // A server that accepts and then says nothing.
    let proxy = Proxy::start(upstream_addr).await.unwrap();
    proxy.silence();
    let silent = proxy.url(url, upstream_addr);
    let started = Instant::now();
    let Err(e) = idem::connect(&silent).await else {
        panic!("{name}: a silent server was reached")
    };
    let took = started.elapsed();
    let bound = idem::connect::DEFAULT_CONNECT_TIMEOUT + Duration::from_secs(1);
    assert!(
        took <= bound,
        "{name}: silent connect answered after {took:?}: {e}"
    );
    assert!(
        e.to_string().contains(&proxy.addr().to_string()),
        "{name}: {e}"
    );
    assert!(
        matches!(e, IdemError::StoreUnavailable { .. }),
        "{name}: {e:?}"
    );
}

#[cfg(feature = "postgres")]
fn pg_url() -> String {
    server::pg_url()
}

#[cfg(feature = "mysql")]
fn mysql_url() -> String {
    server::mysql_url()
}

#[cfg(feature = "redis")]
fn redis_url() -> String {
    server::redis_url()
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_calls_answer_under_a_silence_that_never_ends() {
    let table = server::unique("idemt");
    let url = format!("{}?idem_table={table}", pg_url());
    silence_never_heals("Postgres", &url, Back::NewOnly).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_calls_answer_under_a_silence_that_never_ends() {
    let table = server::unique("idemt");
    let url = format!("{}?idem_table={table}", mysql_url());
    silence_never_heals("MariaDB", &url, Back::NewOnly).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_calls_answer_under_a_silence_that_never_ends() {
    let prefix = format!("{}:", server::unique("silent"));
    let url = format!("{}?idem_prefix={prefix}", redis_url());
    silence_never_heals("Redis", &url, Back::NewOnly).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_calls_answer_under_a_silence_then_get_the_late_replies() {
    let table = server::unique("idemt");
    let url = format!("{}?idem_table={table}", pg_url());
    silence_never_heals("Postgres", &url, Back::Held).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_calls_answer_under_a_silence_then_get_the_late_replies() {
    let table = server::unique("idemt");
    let url = format!("{}?idem_table={table}", mysql_url());
    silence_never_heals("MariaDB", &url, Back::Held).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_calls_answer_under_a_silence_then_get_the_late_replies() {
    let prefix = format!("{}:", server::unique("silent"));
    let url = format!("{}?idem_prefix={prefix}", redis_url());
    silence_never_heals("Redis", &url, Back::Held).await;
}

/// The HTTP layer in front of a store gone silent: the client gets 503 with `Retry-After`
/// within the layer's store timeout, and the handler never runs.
#[cfg(all(feature = "postgres", feature = "axum"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_layer_answers_503_within_its_store_timeout() {
    use axum::Router;
    use axum::http::HeaderName;
    use axum::routing::post;
    use idem::http::{IdempotencyLayer, Principal};

    let table = server::unique("idemt");
    let url = format!("{}?idem_table={table}", pg_url());
    let upstream_addr = upstream(&url);
    let proxy = Proxy::start(upstream_addr).await.unwrap();
    let Some(store) = server::reach(
        "Postgres",
        &url,
        idem::connect(&proxy.url(&url, upstream_addr)),
    )
    .await
    else {
        return;
    };
    store.migrate().await.unwrap();
    let ran = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let layer = IdempotencyLayer::builder(store)
        .principal(Principal::header(HeaderName::from_static("x-user")))
        .store_timeout(TIMEOUT)
        .build()
        .unwrap();
    let counted = ran.clone();
    let app = Router::new()
        .route(
            "/pay",
            post(move || async move {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                "paid"
            }),
        )
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = reqwest::Client::new();
    let pay = |key: &'static str| {
        client
            .post(format!("http://{addr}/pay"))
            .header("x-user", "alice")
            .header("idempotency-key", key)
            .send()
    };
    assert_eq!(pay("first").await.unwrap().status().as_u16(), 200);

    proxy.silence();
    let started = Instant::now();
    let reply = pay("second").await.unwrap();
    let took = started.elapsed();
    assert_eq!(reply.status().as_u16(), 503, "{:?}", reply.text().await);
    assert!(reply.headers().contains_key("retry-after"));
    assert!(took <= BOUND, "503 after {took:?}");
    let replayed = pay("first").await.unwrap();
    assert_eq!(
        replayed.status().as_u16(),
        503,
        "a replay needs the store too"
    );
    assert_eq!(
        ran.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "only the first ran"
    );
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_connect_fails_fast_and_names_the_server() {
    connect_fails_fast("Postgres", &pg_url()).await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mariadb_connect_fails_fast_and_names_the_server() {
    connect_fails_fast("MariaDB", &mysql_url()).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_connect_fails_fast_and_names_the_server() {
    connect_fails_fast("Redis", &redis_url()).await;
}
