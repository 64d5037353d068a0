//! The Idempotency-Key layer in transaction mode (`IdempotencyLayer::builder_tx`) on SQLite (also
//! under `EncryptedStore`),
//! MySQL / MariaDB and Postgres, over real HTTP (an axum server on loopback, a reqwest client):
//! the handler writes its order through the layer's transaction (`LayerTx<…Tx>`), so the
//! order and the stored response commit together. Audited in the handler's own order table.
//!
//! - 64 duplicates released together (a 200 ms handler) create one order, and every one of them
//!   gets that order's response (the first, or a replay after waiting in the database).
//! - A 5xx, a response the storage policy leaves out (422) and a panic leave nothing: no order, no
//!   record; the next request with the key runs at once and creates one.
//!
//! A process killed mid-handler is in `tests/crash/` (`…_service_killed_mid_transaction`).

mod contract;
#[cfg(feature = "postgres")]
#[path = "support/postgres.rs"]
mod pg;
#[path = "support/tx_orders.rs"]
mod tx_orders;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem::http::{IdempotencyLayer, LayerTx, Principal};
use idem::{Store, TransactionalStore, TransitionTx, store::Status};
use tokio::sync::Barrier;
use tx_orders::Orders;

#[derive(Clone)]
struct App {
    table: Arc<str>,
}

/// A serial per response, so a replay is told apart from a second run.
static SERIAL: AtomicU64 = AtomicU64::new(0);

/// `POST /orders`: inserts the order through the layer's transaction, then does what the body
/// says: `fail` answers 500, `refuse` 422, `panic` panics, `slow` takes 200 ms; anything else
/// answers 201 at once.
async fn create<T: Orders>(
    State(app): State<App>,
    headers: HeaderMap,
    mut tx: LayerTx<T>,
    body: String,
) -> Response {
    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
    tx.get_mut()
        .insert_order(&app.table, &key, "handler")
        .await
        .unwrap();
    match body.as_str() {
        "fail" => return (StatusCode::INTERNAL_SERVER_ERROR, "warehouse down").into_response(),
        "refuse" => return (StatusCode::UNPROCESSABLE_ENTITY, "bad order").into_response(),
        "panic" => panic!("the handler died after its insert"),
        "slow" => tokio::time::sleep(Duration::from_millis(200)).await,
        _ => {}
    }
    let serial = SERIAL.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, format!("order {key} #{serial}")).into_response()
}

/// The record key the layer keeps a client key under (no principal: this service has one caller).
fn record_key(key: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(b"-")
        .chain_update(key.as_bytes())
        .finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

type Count = Arc<dyn Fn(String) -> Pin<Box<dyn Future<Output = i64> + Send>> + Send + Sync>;

/// A service in transaction mode on one store.
struct Site {
    url: String,
    store: Arc<dyn Store>,
    /// Orders for a key, in the handler's own table.
    orders: Count,
}

impl Site {
    async fn start<S>(store: S, table: String, orders: Count) -> Site
    where
        S: TransactionalStore + Clone,
        S::Tx: TransitionTx + Orders,
    {
        let layer = IdempotencyLayer::builder_tx(store.clone())
            .principal(Principal::unscoped("a test service with one caller"))
            .build()
            .unwrap();
        layer.check().await.unwrap();
        let app = Router::new()
            .route("/orders", post(create::<S::Tx>))
            .with_state(App {
                table: table.into(),
            })
            .layer(layer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/orders", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Site {
            url,
            store: Arc::new(store),
            orders,
        }
    }

    async fn post(&self, key: &str, body: &str) -> Result<(u16, bool, String), reqwest::Error> {
        let reply = reqwest::Client::new()
            .post(&self.url)
            .header("idempotency-key", key)
            .body(body.to_owned())
            .send()
            .await?;
        let status = reply.status().as_u16();
        let replayed = reply
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        Ok((status, replayed, reply.text().await?))
    }
}

/// Creates the order table `table` on `pool` and gives what counts a key's orders there (`$p`: the
/// driver's placeholder).
macro_rules! order_table {
    ($pool:expr, $table:expr, $p:literal) => {{
        let (pool, table): (_, String) = ($pool.clone(), $table);
        idem::sqlx::query(idem::sqlx::AssertSqlSafe(tx_orders::create_table(&table)))
            .execute(&pool)
            .await
            .unwrap();
        let sql = format!("SELECT COUNT(*) FROM {table} WHERE k = {}", $p);
        let count: Count = Arc::new(move |key| {
            let (pool, sql) = (pool.clone(), sql.clone());
            Box::pin(async move {
                idem::sqlx::query_scalar(idem::sqlx::AssertSqlSafe(sql))
                    .bind(key)
                    .fetch_one(&pool)
                    .await
                    .unwrap()
            })
        });
        count
    }};
}

async fn sqlite_site() -> Option<Site> {
    let dir = Box::leak(Box::new(tempfile::tempdir().unwrap()));
    let store = idem::SqliteStore::open(dir.path().join("shop.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let orders = order_table!(store.pool(), "orders".to_owned(), "?");
    Some(Site::start(store, "orders".to_owned(), orders).await)
}

/// SQLite under `EncryptedStore`: the layer's transaction is an `EncryptedTx` over the SQLite
/// one, and the handler writes through it as through a `SqliteTx`.
#[cfg(feature = "encrypt")]
async fn encrypted_site() -> Option<Site> {
    let dir = Box::leak(Box::new(tempfile::tempdir().unwrap()));
    let inner = idem::SqliteStore::open(dir.path().join("shop.db"))
        .await
        .unwrap();
    inner.migrate().await.unwrap();
    let orders = order_table!(inner.pool(), "orders".to_owned(), "?");
    let keyring = idem::Keyring::new(1, [9u8; 32]).unwrap();
    let store = idem::EncryptedStore::new(inner, keyring);
    Some(Site::start(store, "orders".to_owned(), orders).await)
}

#[cfg(feature = "mysql")]
async fn mysql_site() -> Option<Site> {
    use contract::server;
    let url = server::mysql_url();
    let store = server::reach("MySQL", &url, idem::MySqlStore::connect(&url)).await?;
    let store = store.with_table(&server::unique("idem_htx")).unwrap();
    store.migrate().await.unwrap();
    let table = format!("{}_orders", store.table());
    let orders = order_table!(store.pool(), table.clone(), "?");
    Some(Site::start(store, table, orders).await)
}

#[cfg(feature = "postgres")]
async fn postgres_site() -> Option<Site> {
    let store = pg::store(16).await?;
    let table = format!("{}_orders", store.table());
    let orders = order_table!(store.pool(), table.clone(), "$1");
    Some(Site::start(store, table, orders).await)
}

/// 64 duplicates of a 200 ms order released together: one order, and every reply is its 201
/// (the first's, or the same body replayed once the first transaction committed).
async fn sixty_four_duplicates_create_one_order(site: Site) {
    let site = Arc::new(site);
    let barrier = Arc::new(Barrier::new(64));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (site, barrier) = (Arc::clone(&site), Arc::clone(&barrier));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            site.post("storm", "slow").await.unwrap()
        }));
    }
    let mut bodies = Vec::new();
    let mut replayed = 0;
    for task in tasks {
        let (status, was_replayed, body) = task.await.unwrap();
        assert_eq!(status, 201, "{body}");
        replayed += usize::from(was_replayed);
        bodies.push(body);
    }
    assert!(bodies.iter().all(|b| *b == bodies[0]), "{bodies:?}");
    assert_eq!(replayed, 63, "one ran, 63 replayed it");
    assert_eq!(
        (site.orders)("storm".to_owned()).await,
        1,
        "64 duplicates, one order"
    );
    let record = site
        .store
        .load("HTTP", &record_key("storm"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, Status::Succeeded);
}

/// A 5xx, a 422 (not stored by the default policy) and a panic, each after the handler's insert:
/// no order and no record are left, and the next request with the key runs at once.
async fn what_is_not_stored_leaves_nothing(site: Site) {
    for (key, body) in [("failed", "fail"), ("refused", "refuse"), ("died", "panic")] {
        match site.post(key, body).await {
            Ok((status, _, text)) => {
                assert!(status == 500 || status == 422, "{key}: {status} {text}")
            }
            Err(e) => assert_eq!(body, "panic", "{key}: {e}"),
        }
        assert_eq!(
            (site.orders)(key.to_owned()).await,
            0,
            "{key}: the insert rolled back"
        );
        assert!(
            site.store
                .load("HTTP", &record_key(key))
                .await
                .unwrap()
                .is_none(),
            "{key}: no record"
        );
        let (status, replayed, _) = site.post(key, "ok").await.unwrap();
        assert_eq!((status, replayed), (201, false), "{key}: the retry ran");
        assert_eq!((site.orders)(key.to_owned()).await, 1, "{key}");
        let (status, replayed, _) = site.post(key, "ok").await.unwrap();
        assert_eq!((status, replayed), (201, true), "{key}");
        assert_eq!((site.orders)(key.to_owned()).await, 1, "{key}");
        let record = site.store.load("HTTP", &record_key(key)).await.unwrap();
        assert_eq!(record.map(|r| r.status), Some(Status::Succeeded), "{key}");
    }
}

macro_rules! on_site {
    ($($feature:literal: $name:ident = $scenario:ident on $site:ident;)*) => {$(
        #[cfg(feature = $feature)]
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            if let Some(site) = $site().await {
                $scenario(site).await;
            }
        }
    )*};
}

on_site! {
    "sqlite": sqlite_sixty_four_duplicates_create_one_order = sixty_four_duplicates_create_one_order on sqlite_site;
    "sqlite": sqlite_what_is_not_stored_leaves_nothing = what_is_not_stored_leaves_nothing on sqlite_site;
    "encrypt": encrypted_sixty_four_duplicates_create_one_order = sixty_four_duplicates_create_one_order on encrypted_site;
    "encrypt": encrypted_what_is_not_stored_leaves_nothing = what_is_not_stored_leaves_nothing on encrypted_site;
    "mysql": mysql_sixty_four_duplicates_create_one_order = sixty_four_duplicates_create_one_order on mysql_site;
    "mysql": mysql_what_is_not_stored_leaves_nothing = what_is_not_stored_leaves_nothing on mysql_site;
    "postgres": postgres_sixty_four_duplicates_create_one_order = sixty_four_duplicates_create_one_order on postgres_site;
    "postgres": postgres_what_is_not_stored_leaves_nothing = what_is_not_stored_leaves_nothing on postgres_site;
}

/// A `LayerTx` the layer cannot serve, the mistake of a service only a request can show: behind a
/// layer in lease mode, or of another store's transaction type. Each is a `500` with a problem
/// type of its own whose detail names the mistake, and nothing runs.
#[cfg(all(feature = "sqlite", feature = "mysql"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_tx_the_layer_cannot_serve_is_a_problem_that_names_the_mistake() {
    use idem::{MySqlTx, SqliteStore, SqliteTx};

    static RAN: AtomicU64 = AtomicU64::new(0);
    async fn sqlite_handler(_tx: LayerTx<SqliteTx>) -> &'static str {
        RAN.fetch_add(1, Ordering::SeqCst);
        "ran"
    }
    async fn mysql_handler(_tx: LayerTx<MySqlTx>) -> &'static str {
        RAN.fetch_add(1, Ordering::SeqCst);
        "ran"
    }
    let store = SqliteStore::in_memory().await.unwrap();
    store.migrate().await.unwrap();
    let principal = || Principal::unscoped("a test service with one caller");
    let lease = IdempotencyLayer::builder(store.clone())
        .principal(principal())
        .build()
        .unwrap();
    let tx = IdempotencyLayer::builder_tx(store.clone())
        .principal(principal())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/lease", post(sqlite_handler).layer(lease))
        .route("/other", post(mysql_handler).layer(tx));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    for (path, says) in [
        ("/lease", "built with `builder_tx`"),
        ("/other", "another kind of transaction"),
    ] {
        let reply = reqwest::Client::new()
            .post(format!("{base}{path}"))
            .header("idempotency-key", format!("k{path}"))
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status().as_u16(), 500, "{path}");
        let body: serde_json::Value = reply.json().await.unwrap();
        assert_eq!(
            body["type"], "urn:idem:problem:layer-misconfigured",
            "{path}: {body}"
        );
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains(says), "{path}: {detail}");
        assert!(detail.contains("LayerTx<"), "{path}: {detail}");
    }
    assert_eq!(RAN.load(Ordering::SeqCst), 0, "no handler ran");
}

/// A transaction-mode handler on MySQL with a JSON body, as a service writes it (the `idem::http`
/// module docs show one on SQLite): it compiles, and its router builds.
#[cfg(feature = "mysql")]
mod readme_handler {
    use axum::{
        Json, Router,
        http::StatusCode,
        response::{IntoResponse, Response},
        routing::post,
    };
    use idem::http::{IdempotencyLayer, LayerTx, Principal};

    #[derive(serde::Serialize, serde::Deserialize)]
    struct NewOrder {
        no: String,
        item: String,
    }

    async fn create_order(mut tx: LayerTx<idem::MySqlTx>, Json(order): Json<NewOrder>) -> Response {
        let inserted = idem::sqlx::query("INSERT INTO orders (no, item) VALUES (?, ?)")
            .bind(&order.no)
            .bind(&order.item)
            .execute(tx.conn()) // in the layer's transaction
            .await;
        match inserted {
            Ok(_) => (StatusCode::CREATED, Json(order)).into_response(),
            // A 5xx is not stored: the layer rolls the transaction back, and a retry runs again.
            Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
        }
    }

    #[tokio::test]
    async fn the_readme_handler_builds_a_router() {
        let url = super::contract::server::mysql_url();
        let Some(mysql_store) =
            super::contract::server::reach("MySQL", &url, idem::MySqlStore::connect(&url)).await
        else {
            return;
        };
        let user = axum::http::HeaderName::from_static("x-user");
        let layer = IdempotencyLayer::builder_tx(mysql_store)
            .principal(Principal::header(user))
            .build()
            .unwrap();
        let _app: Router = Router::new().route("/orders", post(create_order).layer(layer));
    }
}
