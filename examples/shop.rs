//! A small shop service to copy from: axum, the Idempotency-Key layer in transaction mode (the
//! order row and the stored response commit together), an SQL store, a state machine for orders,
//! one-time submit tokens, and Prometheus metrics.
//!
//! ```sh
//! cargo run -p idem-suite --example shop --features axum,metrics                 # embedded SQLite (shop.db in the temp dir)
//! IDEM_STORE_URL=mysql://root@127.0.0.1:3306/test \
//!     cargo run -p idem-suite --example shop --features axum,metrics,mysql       # on MariaDB / MySQL
//! ```
//!
//! It listens on `127.0.0.1:3000` (`SHOP_ADDR` to change). The caller is the `x-user-id` header,
//! which stands for what your gateway sets after it authenticated the request:
//!
//! | Route | What | Duplicates |
//! |---|---|---|
//! | `POST /orders` `{"item", "amount"}` | creates an order (`WAIT_PAY`), 201 | `Idempotency-Key` header: a repeat replays the 201; the order is written in the layer's transaction, so a crash leaves neither order nor record |
//! | `POST /orders/{no}/pay` | `WAIT_PAY` → `PAID`, 200 | state machine: a repeat is 200 again, a wrong state 409 |
//! | `POST /tokens` | a one-time submit token for the cancel form, 201 | |
//! | `POST /orders/{no}/cancel` | `WAIT_PAY` → `CANCELLED`, 200 | `X-Idem-Token`: a second submit is 409 `token-used` |
//! | `GET /orders/{no}` | the order, 200 (404 for another user's or no order) | |
//! | `GET /metrics` | idem's counters and histograms, Prometheus text | |
//!
//! ```sh
//! curl -si -XPOST localhost:3000/orders -H 'x-user-id: alice' -H 'Idempotency-Key: "k1"' \
//!      -H 'content-type: application/json' -d '{"item":"book","amount":1200}'
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idem::http::{IdempotencyLayer, LayerTx, Principal, TokenEndpoint, TokenGuardLayer};
use idem::{IdemError, StateMachine, Store, TokenStore, Transition, state_transition};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use serde_json::json;

/// The name the shop's store is registered under (`#[state_transition(store = "shop")]`).
pub const STORE: &str = "shop";
/// The header that names the caller.
pub const USER: HeaderName = HeaderName::from_static("x-user-id");

/// An order's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(table = "shop_orders", key = "order_no", status = "status")]
pub enum OrderStatus {
    #[state(to(Paid, Cancelled))]
    WaitPay,
    #[state(terminal)]
    Paid,
    #[state(terminal)]
    Cancelled,
}

/// Pays an order: one conditional UPDATE from `WAIT_PAY`, in a transaction on the shop's store.
#[state_transition(from = "WAIT_PAY", to = "PAID", store = "shop")]
async fn pay(order_no: &str) -> Result<Transition<(), OrderStatus>, IdemError> {
    Ok(())
}

/// Cancels an order that is not paid yet.
#[state_transition(from = "WAIT_PAY", to = "CANCELLED", store = "shop")]
async fn cancel(order_no: &str) -> Result<Transition<(), OrderStatus>, IdemError> {
    Ok(())
}

/// The shop's store, whose database also holds the shop's own tables (SQLite or MySQL; both
/// take `?` placeholders).
#[allow(clippy::large_enum_variant)] // one per service
#[derive(Clone)]
pub enum Db {
    /// The embedded default.
    Sqlite(idem::SqliteStore),
    /// MariaDB / MySQL.
    #[cfg(feature = "mysql")]
    MySql(idem::MySqlStore),
}

const ORDERS_DDL: &str = "CREATE TABLE IF NOT EXISTS shop_orders (
    order_no VARCHAR(40) PRIMARY KEY,
    owner VARCHAR(128) NOT NULL,
    item VARCHAR(128) NOT NULL,
    amount BIGINT NOT NULL,
    status VARCHAR(16) NOT NULL)";

const INSERT_ORDER: &str =
    "INSERT INTO shop_orders (order_no, owner, item, amount, status) VALUES (?, ?, ?, ?, ?)";

/// One order row: (owner, item, amount, status).
type OrderRow = (String, String, i64, String);

macro_rules! on_pool {
    ($db:expr, $pool:ident => $body:expr) => {
        match $db {
            Db::Sqlite(store) => {
                let $pool = store.pool();
                $body
            }
            #[cfg(feature = "mysql")]
            Db::MySql(store) => {
                let $pool = store.pool();
                $body
            }
        }
    };
}

impl Db {
    async fn setup(&self) -> Result<(), idem::sqlx::Error> {
        on_pool!(self, pool => idem::sqlx::query(ORDERS_DDL).execute(pool).await.map(drop))
    }

    async fn find(&self, no: &str) -> Result<Option<OrderRow>, idem::sqlx::Error> {
        let sql = "SELECT owner, item, amount, status FROM shop_orders WHERE order_no = ?";
        on_pool!(self, pool => idem::sqlx::query_as(sql).bind(no).fetch_optional(pool).await)
    }
}

/// The transaction the layer lends `POST /orders`: the store's own (`SqliteTx`, `MySqlTx`).
pub trait OrderTx: Send + Sync + 'static {
    /// Inserts a new order in `WAIT_PAY`.
    fn insert_order(
        &mut self,
        no: &str,
        owner: &str,
        item: &str,
        amount: i64,
    ) -> impl Future<Output = Result<(), idem::sqlx::Error>> + Send;
}

macro_rules! order_tx {
    ($($tx:ty),*) => {$(
        impl OrderTx for $tx {
            async fn insert_order(
                &mut self,
                no: &str,
                owner: &str,
                item: &str,
                amount: i64,
            ) -> Result<(), idem::sqlx::Error> {
                idem::sqlx::query(INSERT_ORDER)
                    .bind(no)
                    .bind(owner)
                    .bind(item)
                    .bind(amount)
                    .bind(OrderStatus::WaitPay.as_str())
                    .execute(&mut **self)
                    .await
                    .map(drop)
            }
        }
    )*};
}

order_tx!(idem::SqliteTx);
#[cfg(feature = "mysql")]
order_tx!(idem::MySqlTx);

/// What the handlers share.
#[derive(Clone)]
pub struct Shop {
    db: Db,
    metrics: PrometheusHandle,
}

/// The request body of `POST /orders`.
#[derive(Deserialize)]
pub struct NewOrder {
    item: String,
    amount: i64,
}

fn problem(status: StatusCode, detail: impl Into<String>) -> Response {
    let body = json!({ "type": "about:blank", "status": status.as_u16(), "detail": detail.into() });
    (
        status,
        [("content-type", "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

fn internal(e: impl std::fmt::Display) -> Response {
    tracing::error!(error = %e, "shop request failed");
    problem(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
}

fn caller(headers: &HeaderMap) -> &str {
    headers
        .get(&USER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// A new order number: time and a counter (a real shop would use its own sequence).
fn order_no() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    format!("O{micros}-{}", SEQ.fetch_add(1, Ordering::Relaxed))
}

/// Creates an order through the layer's transaction: the row commits with the stored 201, or
/// neither does.
async fn create_order<T: OrderTx>(
    headers: HeaderMap,
    mut tx: LayerTx<T>,
    body: axum::Json<NewOrder>,
) -> Response {
    if body.amount <= 0 || body.item.is_empty() || body.item.len() > 128 {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "an order needs an item and a positive amount",
        );
    }
    let no = order_no();
    if let Err(e) = tx
        .get_mut()
        .insert_order(&no, caller(&headers), &body.item, body.amount)
        .await
    {
        return internal(e);
    }
    let order = json!({ "order_no": no, "item": body.item, "amount": body.amount, "status": OrderStatus::WaitPay.as_str() });
    (
        StatusCode::CREATED,
        [("location", format!("/orders/{no}"))],
        axum::Json(order),
    )
        .into_response()
}

/// The order if it is the caller's.
async fn owned(shop: &Shop, headers: &HeaderMap, no: &str) -> Result<OrderRow, Response> {
    match shop.db.find(no).await {
        Ok(Some(row)) if row.0 == caller(headers) => Ok(row),
        Ok(_) => Err(problem(StatusCode::NOT_FOUND, "no such order")),
        Err(e) => Err(internal(e)),
    }
}

async fn get_order(
    State(shop): State<Shop>,
    headers: HeaderMap,
    Path(no): Path<String>,
) -> Response {
    match owned(&shop, &headers, &no).await {
        Ok((_, item, amount, status)) => {
            axum::Json(json!({ "order_no": no, "item": item, "amount": amount, "status": status }))
                .into_response()
        }
        Err(response) => response,
    }
}

/// A transition's outcome as an answer: applied now or before → 200 with the new state.
fn moved(
    no: &str,
    to: OrderStatus,
    outcome: Result<Transition<(), OrderStatus>, IdemError>,
) -> Response {
    match outcome {
        Ok(Transition::Applied(()) | Transition::AlreadyApplied) => {
            axum::Json(json!({ "order_no": no, "status": to.as_str() })).into_response()
        }
        Ok(Transition::Rejected { current } | Transition::VersionConflict { current, .. }) => {
            problem(
                StatusCode::CONFLICT,
                format!(
                    "the order is {}; it cannot become {}",
                    current.as_str(),
                    to.as_str()
                ),
            )
        }
        Ok(Transition::NotFound) => problem(StatusCode::NOT_FOUND, "no such order"),
        Err(e) if e.is_retryable() => problem(StatusCode::SERVICE_UNAVAILABLE, "try again"),
        Err(e) => internal(e),
    }
}

/// `POST /orders/{no}/pay` and `…/cancel`: the caller's order moves to `to`.
async fn move_order(shop: Shop, headers: HeaderMap, no: String, to: OrderStatus) -> Response {
    if let Err(response) = owned(&shop, &headers, &no).await {
        return response;
    }
    let outcome = match to {
        OrderStatus::Paid => pay(&no).await,
        _ => cancel(&no).await,
    };
    moved(&no, to, outcome)
}

fn to(status: OrderStatus) -> axum::routing::MethodRouter<Shop> {
    post(
        move |State(shop): State<Shop>, headers: HeaderMap, Path(no): Path<String>| {
            move_order(shop, headers, no, status)
        },
    )
}

/// The service on `store` (registered as [`STORE`]), its tables on `db`, its tokens in `tokens`,
/// and idem's metrics from `metrics` at `/metrics`.
pub async fn app(
    store: Arc<dyn Store>,
    db: Db,
    tokens: Arc<dyn TokenStore>,
    metrics: PrometheusHandle,
) -> Result<Router, Box<dyn std::error::Error + Send + Sync>> {
    db.setup().await?;
    idem::register_store(STORE, Arc::clone(&store));
    let principal = Principal::header(USER);
    // Transaction mode: the layer begins a transaction on the store for each new key and lends
    // it to `create_order`; the order row and the stored response commit together.
    let idempotent = |builder: idem::http::IdempotencyBuilder| {
        builder
            .biz("SHOP_HTTP")
            .principal(principal.clone())
            .cap_per_principal(1000, Duration::from_secs(60))
            .build()
    };
    let create = match &db {
        Db::Sqlite(store) => post(create_order::<idem::SqliteTx>)
            .layer(idempotent(IdempotencyLayer::builder_tx(store.clone()))?),
        #[cfg(feature = "mysql")]
        Db::MySql(store) => post(create_order::<idem::MySqlTx>)
            .layer(idempotent(IdempotencyLayer::builder_tx(store.clone()))?),
    };
    let shop = Shop { db, metrics };
    Ok(Router::new()
        .route("/orders", create)
        .route("/orders/{no}", get(get_order))
        .route("/orders/{no}/pay", to(OrderStatus::Paid))
        .route(
            "/orders/{no}/cancel",
            to(OrderStatus::Cancelled).layer(TokenGuardLayer::shared(
                Arc::clone(&tokens),
                principal.clone(),
            )),
        )
        .route("/tokens", TokenEndpoint::shared(tokens, principal).route())
        .route(
            "/metrics",
            get(|State(shop): State<Shop>| async move { shop.metrics.render() }),
        )
        .with_state(shop))
}

/// The store, the shop's database and the token store, from `IDEM_STORE_URL` (`sqlite:PATH` or
/// `mysql://…`: order creation runs in the layer's transaction mode, so the store is one of the
/// SQL stores whose database also holds the orders; `SHOP_MYSQL_URL` is read too, as before),
/// else SQLite in `path`.
pub async fn open(
    path: &std::path::Path,
) -> Result<(Arc<dyn Store>, Db, Arc<dyn TokenStore>), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("IDEM_STORE_URL")
        .or_else(|_| std::env::var("SHOP_MYSQL_URL"))
        .unwrap_or_else(|_| format!("sqlite:{}", path.display()));
    let scheme = url.split(':').next().unwrap_or("").to_ascii_lowercase();
    let db = match scheme.as_str() {
        "sqlite" => {
            let file = url.trim_start_matches("sqlite:").trim_start_matches("//");
            Db::Sqlite(idem::SqliteStore::open(file).await?)
        }
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Db::MySql(idem::MySqlStore::connect(&url).await?),
        #[cfg(not(feature = "mysql"))]
        "mysql" | "mariadb" => {
            return Err(format!(
                "{url} needs the mysql feature: cargo run -p idem-suite --example shop --features axum,metrics,mysql"
            )
            .into());
        }
        _ => {
            return Err(format!(
                "the shop creates orders in the layer's transaction mode, on the store's own database: \
                 give IDEM_STORE_URL as sqlite:PATH or mysql://…, not {url}"
            )
            .into());
        }
    };
    Ok(match db {
        Db::Sqlite(store) => {
            store.migrate().await?;
            let tokens = Arc::new(store.tokens());
            (Arc::new(store.clone()), Db::Sqlite(store), tokens)
        }
        #[cfg(feature = "mysql")]
        Db::MySql(store) => {
            store.migrate().await?;
            let tokens = Arc::new(store.tokens());
            (Arc::new(store.clone()), Db::MySql(store), tokens)
        }
    })
}

#[tokio::main]
#[allow(dead_code)]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let (store, db, tokens) = open(&std::env::temp_dir().join("shop.db")).await?;
    println!("store: {}", store.backend());
    let _sweeper = idem::Sweeper::new(Arc::clone(&store), 500).spawn(Duration::from_secs(60))?;
    let app = app(store, db, tokens, metrics).await?;
    let addr = std::env::var("SHOP_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("shop listening on http://{addr}");
    axum::serve(listener, app).await?;
    Ok(())
}
