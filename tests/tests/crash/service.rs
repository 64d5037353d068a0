//! Services with the Idempotency-Key layer killed mid-request: after the handler's effect (lease
//! mode, with and without `recover`), and mid-handler in transaction mode.

use super::*;

/// `POST /orders` with an Idempotency-Key: writes the effect under the key as `who`, then (when
/// `hang`) says READY and waits to be killed; else answers 201 `ordered by <who>`.
#[cfg(feature = "axum")]
pub(super) fn http_shop(effects: SqlitePool, who: &'static str, hang: bool) -> axum::Router {
    let order = move |headers: axum::http::HeaderMap| {
        let effects = effects.clone();
        async move {
            let key = headers["idempotency-key"].to_str().unwrap().to_owned();
            effect(&effects, "CRASHHTTP", &key, who).await.unwrap();
            if hang {
                say("READY");
                std::future::pending::<()>().await;
            }
            (axum::http::StatusCode::CREATED, format!("ordered by {who}"))
        }
    };
    axum::Router::new().route("/orders", axum::routing::post(order))
}

/// The layer on `store`, with `recover` reading the effects table when given.
#[cfg(feature = "axum")]
pub(super) fn http_layer(
    store: Arc<dyn Store>,
    lease: Duration,
    recover: Option<SqlitePool>,
) -> idem::http::IdempotencyLayer {
    let builder = idem::http::IdempotencyLayer::builder(store)
        .principal(idem::http::Principal::unscoped(
            "a test service with one caller",
        ))
        .lease(lease);
    let builder = match recover {
        None => builder,
        Some(effects) => builder.recover(move |req: idem::http::RecoverRequest| {
            let effects = effects.clone();
            async move {
                use axum::response::IntoResponse;
                let seen = effects_of(&effects, "CRASHHTTP", &req.key).await;
                Ok(seen.first().map(|who| {
                    (axum::http::StatusCode::CREATED, format!("ordered by {who}")).into_response()
                }))
            }
        }),
    };
    builder.build().unwrap()
}

/// Starts the child service `spec` serves (it says `LISTEN <port>`), sends it `POST /orders`
/// with `key`, and kills it (SIGKILL) once its handler says READY: the request dies with it.
#[cfg(feature = "axum")]
async fn killed_mid_request(spec: Spec, client: &reqwest::Client, key: &str) {
    let mut child = tokio::task::spawn_blocking(move || {
        let mut child = Running::spawn(&spec);
        let port = child.wait_for("LISTEN");
        (
            child,
            port.trim_start_matches("LISTEN ").parse::<u16>().unwrap(),
        )
    })
    .await
    .unwrap();
    let first = {
        let (client, key, port) = (client.clone(), key.to_owned(), child.1);
        tokio::spawn(async move {
            client
                .post(format!("http://127.0.0.1:{port}/orders"))
                .header("idempotency-key", key)
                .send()
                .await
        })
    };
    child = tokio::task::spawn_blocking(move || {
        child.0.wait_for("READY");
        child
    })
    .await
    .unwrap();
    child.0.kill();
    assert!(
        first.await.unwrap().is_err(),
        "the service died mid-request"
    );
}

/// A service killed (SIGKILL) after its handler's effect and before the layer stored the
/// response, 4 times (half of them with `recover`): after the lease, a retry at a restarted service
/// with `recover` gets the first order's response and no second effect; without `recover`, the
/// documented behaviour of lease mode alone: the handler runs again.
#[cfg(feature = "axum")]
async fn service_killed_after_its_handlers_effect(site: Site) {
    let lease = Duration::from_secs(2);
    let client = reqwest::Client::new();
    for trial in 0..4 {
        let with_recover = trial % 2 == 0;
        let key = format!("order-{trial}");
        let spec = site.spec("CRASHHTTP", &key, lease, Act::ServeHttp);
        killed_mid_request(spec, &client, &key).await;
        assert_eq!(
            effects_of(&site.effects, "CRASHHTTP", &key).await,
            ["child"]
        );

        // The service comes back (in this process) on the same records.
        let recover = with_recover.then(|| site.effects.clone());
        let app = http_shop(site.effects.clone(), "repeat", false).layer(http_layer(
            open(&site.backend).await,
            lease,
            recover,
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/orders", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let early = client
            .post(&url)
            .header("idempotency-key", &key)
            .send()
            .await
            .unwrap();
        assert_eq!(
            early.status(),
            409,
            "{key}: in progress until the lease ends"
        );
        tokio::time::sleep(lease + Duration::from_millis(200)).await;
        let retry = client
            .post(&url)
            .header("idempotency-key", &key)
            .send()
            .await
            .unwrap();
        assert_eq!(retry.status(), 201, "{key}");
        let effects = effects_of(&site.effects, "CRASHHTTP", &key).await;
        if with_recover {
            assert_eq!(retry.headers()["idempotent-replayed"], "true", "{key}");
            assert_eq!(retry.text().await.unwrap(), "ordered by child", "{key}");
            assert_eq!(effects, ["child"], "{key}: no second effect");
        } else {
            assert_eq!(retry.text().await.unwrap(), "ordered by repeat", "{key}");
            assert_eq!(
                effects,
                ["child", "repeat"],
                "{key}: lease mode alone runs it again"
            );
        }
        server.abort();
    }
}

/// The layer in transaction mode on the site's SQL store, with a handler that inserts the order
/// (`who`) through the layer's transaction and then (when `hang`) says READY and waits to be
/// killed, else answers 201 `ordered by <who>`.
#[cfg(feature = "axum")]
pub(super) async fn tx_service(backend: &Backend, who: &'static str, hang: bool) -> axum::Router {
    match backend {
        Backend::Sqlite { path } => tx_router(
            SqliteStore::open(path).await.unwrap(),
            orders_table(backend),
            who,
            hang,
        ),
        #[cfg(feature = "postgres")]
        Backend::Postgres { url, table } => {
            tx_router(pg_store(url, table).await, orders_table(backend), who, hang)
        }
        #[cfg(feature = "mysql")]
        Backend::MySql { url, table } => {
            tx_router(my_store(url, table).await, orders_table(backend), who, hang)
        }
        _ => unreachable!("transaction mode runs on SQL stores"),
    }
}

/// The handler's order table in the store's database.
#[cfg(feature = "axum")]
pub(super) fn orders_table(backend: &Backend) -> String {
    match backend {
        Backend::Postgres { table, .. } | Backend::MySql { table, .. } => format!("{table}_orders"),
        _ => "orders".to_owned(),
    }
}

#[cfg(feature = "axum")]
fn tx_router<S>(store: S, table: String, who: &'static str, hang: bool) -> axum::Router
where
    S: idem::TransactionalStore,
    S::Tx: idem::TransitionTx + tx_orders::Orders,
{
    use tx_orders::Orders;
    let layer = idem::http::IdempotencyLayer::builder_tx(store)
        .principal(idem::http::Principal::unscoped(
            "a test service with one caller",
        ))
        .build()
        .unwrap();
    let order = move |headers: axum::http::HeaderMap, mut tx: idem::http::LayerTx<S::Tx>| {
        let table = table.clone();
        async move {
            let key = headers["idempotency-key"].to_str().unwrap().to_owned();
            tx.get_mut().insert_order(&table, &key, who).await.unwrap();
            if hang {
                say("READY");
                std::future::pending::<()>().await;
            }
            (axum::http::StatusCode::CREATED, format!("ordered by {who}"))
        }
    };
    axum::Router::new()
        .route("/orders", axum::routing::post(order))
        .layer(layer)
}

/// Runs `sql` (one statement, binding `key` when it has a placeholder) on the site's SQL
/// database; the first column of its row, if any.
#[cfg(feature = "axum")]
pub(super) async fn on_db(backend: &Backend, sql: String, key: Option<&str>) -> Option<i64> {
    macro_rules! run {
        ($pool:expr) => {{
            let q = sqlx::query_scalar(sqlx::AssertSqlSafe(sql));
            let q = match key {
                Some(key) => q.bind(key.to_owned()),
                None => q,
            };
            q.fetch_optional($pool).await.unwrap()
        }};
    }
    match backend {
        Backend::Sqlite { path } => run!(SqliteStore::open(path).await.unwrap().pool()),
        #[cfg(feature = "postgres")]
        Backend::Postgres { url, table } => run!(pg_store(url, table).await.pool()),
        #[cfg(feature = "mysql")]
        Backend::MySql { url, table } => run!(my_store(url, table).await.pool()),
        _ => unreachable!("transaction mode runs on SQL stores"),
    }
}

/// A service with the layer in transaction mode killed (SIGKILL) mid-handler, after its insert
/// and before the commit, 3 times: the database rolls the transaction back, so no order and no
/// record are left; a retry at a restarted service runs at once (no lease to wait for) and
/// creates exactly one order, and a repeat replays it.
#[cfg(feature = "axum")]
async fn service_killed_mid_transaction(site: Site) {
    let table = orders_table(&site.backend);
    on_db(&site.backend, tx_orders::create_table(&table), None).await;
    let placeholder = match site.backend {
        Backend::Postgres { .. } => "$1",
        _ => "?",
    };
    let count = format!("SELECT COUNT(*) FROM {table} WHERE k = {placeholder}");
    let client = reqwest::Client::new();
    for trial in 0..3 {
        let key = format!("tx-order-{trial}");
        let spec = site.spec("HTTP", &key, Duration::from_secs(30), Act::ServeHttpTx);
        killed_mid_request(spec, &client, &key).await;

        let app = tx_service(&site.backend, "repeat", false).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/orders", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        // The server may take a moment to see the connection die and roll back: the retry waits
        // for the lock meanwhile, never for a lease.
        let retry = client
            .post(&url)
            .header("idempotency-key", &key)
            .send()
            .await
            .unwrap();
        assert_eq!(retry.status(), 201, "{key}");
        assert!(
            !retry.headers().contains_key("idempotent-replayed"),
            "{key}"
        );
        assert_eq!(retry.text().await.unwrap(), "ordered by repeat", "{key}");
        let orders = on_db(&site.backend, count.clone(), Some(&key)).await;
        assert_eq!(
            orders,
            Some(1),
            "{key}: the killed insert rolled back, the retry's stayed"
        );
        let again = client
            .post(&url)
            .header("idempotency-key", &key)
            .send()
            .await
            .unwrap();
        assert_eq!(again.headers()["idempotent-replayed"], "true", "{key}");
        assert_eq!(
            on_db(&site.backend, count.clone(), Some(&key)).await,
            Some(1)
        );
        server.abort();
    }
}

#[cfg(feature = "axum")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_service_killed_mid_transaction() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    service_killed_mid_transaction(sqlite_site().await).await;
}

#[cfg(feature = "axum")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_service_killed_after_its_handlers_effect() {
    if std::env::var("IDEM_CRASH_CHILD").is_ok() {
        return;
    }
    service_killed_after_its_handlers_effect(sqlite_site().await).await;
}

on_server! {
    all(feature = "axum", feature = "mysql"): mysql_service_killed_mid_transaction = service_killed_mid_transaction on my_site;
    all(feature = "axum", feature = "postgres"): postgres_service_killed_mid_transaction = service_killed_mid_transaction on pg_site;
}

on_server! {
    all(feature = "axum", feature = "mysql"): mysql_service_killed_after_its_handlers_effect = service_killed_after_its_handlers_effect on my_site;
    all(feature = "axum", feature = "postgres"): postgres_service_killed_after_its_handlers_effect = service_killed_after_its_handlers_effect on pg_site;
    all(feature = "axum", feature = "redis"): redis_service_killed_after_its_handlers_effect = service_killed_after_its_handlers_effect on redis_site;
    all(feature = "axum", feature = "dynamodb"): dynamo_service_killed_after_its_handlers_effect = service_killed_after_its_handlers_effect on dynamo_site;
}
