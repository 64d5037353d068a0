//! The Idempotency-Key layer and the token guard over real HTTP: an axum server on loopback, a
//! reqwest client, and the handler's side effects audited in their own SQLite table.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use idem::http::{IdempotencyBuilder, IdempotencyLayer, Principal, TokenEndpoint, TokenGuardLayer};
use idem::sqlx::SqlitePool;
use idem::{IdemError, MemoryTokens, SqliteStore, TokenStore};
use serde_json::{Value, json};
use tokio::sync::Barrier;

const USER: &str = "x-user";

/// The service under test: `POST /orders` writes a row to its own table and answers 201 with the
/// order's id; `GET /orders` counts rows.
#[derive(Clone)]
struct Shop {
    db: SqlitePool,
    /// Milliseconds each order takes (to hold the claim while duplicates arrive).
    slow_ms: Arc<AtomicU32>,
    /// Requests to answer with 500 before succeeding.
    fail_next: Arc<AtomicU32>,
    /// Requests whose handler dies (panics) right after writing its order.
    die_next: Arc<AtomicU32>,
}

impl Shop {
    async fn new() -> Shop {
        let db = SqlitePool::connect("sqlite::memory:").await.unwrap();
        idem::sqlx::query(
            "CREATE TABLE orders (id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT, item TEXT)",
        )
        .execute(&db)
        .await
        .unwrap();
        Shop {
            db,
            slow_ms: Arc::new(AtomicU32::new(0)),
            fail_next: Arc::new(AtomicU32::new(0)),
            die_next: Arc::new(AtomicU32::new(0)),
        }
    }

    async fn rows(&self) -> i64 {
        idem::sqlx::query_scalar("SELECT COUNT(*) FROM orders")
            .fetch_one(&self.db)
            .await
            .unwrap()
    }

    fn router(&self) -> Router {
        let shop = self.clone();
        let create = move |headers: HeaderMap, body: axum::Json<Value>| {
            let shop = shop.clone();
            async move {
                let slow = shop.slow_ms.load(Ordering::SeqCst);
                if slow > 0 {
                    tokio::time::sleep(Duration::from_millis(slow.into())).await;
                }
                if shop
                    .fail_next
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                {
                    return (StatusCode::INTERNAL_SERVER_ERROR, "warehouse down").into_response();
                }
                let owner = headers
                    .get(USER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                let item = body["item"].as_str().unwrap_or("").to_owned();
                let id: i64 = idem::sqlx::query_scalar(
                    "INSERT INTO orders (owner, item) VALUES (?, ?) RETURNING id",
                )
                .bind(owner)
                .bind(&item)
                .fetch_one(&shop.db)
                .await
                .unwrap();
                if shop
                    .die_next
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                {
                    panic!("the handler died after writing order {id}");
                }
                let text = if item == "big" {
                    "x".repeat(4096)
                } else {
                    item
                };
                (
                    StatusCode::CREATED,
                    [
                        ("location", format!("/orders/{id}")),
                        ("set-cookie", format!("s={id}")),
                    ],
                    axum::Json(json!({ "order_id": id, "owner": owner, "item": text })),
                )
                    .into_response()
            }
        };
        Router::new()
            .route("/orders", post(create).get(|| async { "list" }))
            .route("/health", get(|| async { "ok" }))
    }
}

fn builder(store: &SqliteStore) -> IdempotencyBuilder {
    IdempotencyLayer::builder(store.clone())
        .principal(Principal::header(HeaderName::from_static(USER)))
        .max_response_bytes(2048)
}

async fn store() -> SqliteStore {
    let store = SqliteStore::in_memory().await.unwrap();
    store.migrate().await.unwrap();
    store
}

/// Serves `app` on a loopback port; returns its base URL.
async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

async fn start(shop: &Shop, layer: IdempotencyLayer) -> String {
    serve(shop.router().layer(layer)).await
}

struct Reply {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Reply {
    /// A response read whole: a JSON body parsed, any other kept as a string.
    async fn of(response: reqwest::Response) -> Reply {
        let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Reply {
            status,
            headers,
            body,
        }
    }

    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    fn problem(&self) -> &str {
        assert_eq!(
            self.headers["content-type"], "application/problem+json",
            "{:?}",
            self.body
        );
        self.body["type"].as_str().unwrap()
    }
}

/// A client of the service at `url`.
#[derive(Clone)]
struct Api {
    client: reqwest::Client,
    url: String,
}

impl Api {
    fn new(url: &str) -> Api {
        Api {
            client: reqwest::Client::new(),
            url: url.to_owned(),
        }
    }

    /// `POST /orders` as `user` with `key` (when given) and a JSON `body`.
    async fn post(&self, user: Option<&str>, key: Option<&str>, body: Value) -> Reply {
        let mut req = self.client.post(format!("{}/orders", self.url)).json(&body);
        if let Some(user) = user {
            req = req.header(USER, user);
        }
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        Reply::of(req.send().await.unwrap()).await
    }

    /// `POST /orders` as alice with `key`, the body `body` sent as it is with `content_type`, and
    /// extra `headers`.
    async fn post_raw(
        &self,
        key: &str,
        content_type: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut req = self
            .client
            .post(format!("{}/orders", self.url))
            .header(USER, "alice")
            .header("idempotency-key", key)
            .header("content-type", content_type)
            .body(body.to_owned());
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        Reply::of(req.send().await.unwrap()).await
    }

    /// `n` copies of alice's order of a TV under `key`, released together by a barrier; their
    /// replies.
    async fn released_together(&self, n: usize, key: &str) -> Vec<Reply> {
        let barrier = Arc::new(Barrier::new(n));
        let mut tasks = Vec::new();
        for _ in 0..n {
            let (api, barrier, key) = (self.clone(), Arc::clone(&barrier), key.to_owned());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                api.post(Some("alice"), Some(&key), json!({ "item": "tv" }))
                    .await
            }));
        }
        let mut replies = Vec::new();
        for task in tasks {
            replies.push(task.await.unwrap());
        }
        replies
    }

    /// Alice's order `item` under `key`, sent while the same request sent `gap` earlier is still
    /// running: (the first reply, the repeat's).
    async fn overlapping(&self, key: &str, item: &str, gap: Duration) -> (Reply, Reply) {
        let first = {
            let (api, key, item) = (self.clone(), key.to_owned(), item.to_owned());
            tokio::spawn(async move {
                api.post(Some("alice"), Some(&key), json!({ "item": item }))
                    .await
            })
        };
        tokio::time::sleep(gap).await;
        let repeat = self
            .post(Some("alice"), Some(key), json!({ "item": item }))
            .await;
        (first.await.unwrap(), repeat)
    }
}

/// The record key the layer uses (SHA-256 of the caller and the key): the test recomputes it to
/// look in the store.
fn idem_record_key(principal: &str, key: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update(b"p");
    hash.update((principal.len() as u64).to_be_bytes());
    hash.update(principal.as_bytes());
    hash.update(key.as_bytes());
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// A reply read off a raw connection: status, head (lowercase), body.
struct RawReply {
    status: u16,
    head: String,
    body: Value,
}

impl RawReply {
    fn problem(&self) -> &str {
        assert!(
            self.head.contains("content-type: application/problem+json"),
            "{}",
            self.head
        );
        self.body["type"].as_str().unwrap()
    }
}

/// Writes `request` as it is on a fresh connection to the service at `url` (reqwest may merge
/// repeated header lines; this sends exactly the bytes the test wrote), closes the write side when
/// `shut_write` (a client whose body ends early), and reads the reply until the server closes.
async fn raw(url: &str, request: &str, shut_write: bool) -> RawReply {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .unwrap();
    conn.write_all(request.as_bytes()).await.unwrap();
    if shut_write {
        conn.shutdown().await.unwrap();
    }
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut reply))
        .await
        .expect("the server answers and closes")
        .unwrap();
    let reply = String::from_utf8(reply).unwrap();
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no reply: {reply:?}"));
    let status = head[9..12].parse().unwrap();
    RawReply {
        status,
        head: head.to_ascii_lowercase(),
        body: serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned())),
    }
}

/// `POST /orders` with `headers` (whole lines) and `body`, announcing `length` bytes.
fn raw_post(headers: &[&str], length: usize, body: &str) -> String {
    let mut request = String::from("POST /orders HTTP/1.1\r\nhost: idem\r\nconnection: close\r\n");
    request.push_str("content-type: application/json\r\n");
    for line in headers {
        request.push_str(line);
        request.push_str("\r\n");
    }
    request.push_str(&format!("content-length: {length}\r\n\r\n{body}"));
    request
}

async fn records(store: &SqliteStore) -> i64 {
    idem::sqlx::query_scalar("SELECT COUNT(*) FROM idem_record")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// The order `owner` placed for `item`, as the handler answered it: what a recover fn looks up.
async fn order_of(db: &SqlitePool, owner: &str, item: &str) -> Option<axum::response::Response> {
    let id: Option<i64> =
        idem::sqlx::query_scalar("SELECT id FROM orders WHERE owner = ? AND item = ?")
            .bind(owner)
            .bind(item)
            .fetch_optional(db)
            .await
            .unwrap();
    id.map(|id| {
        (
            StatusCode::CREATED,
            [("location", format!("/orders/{id}"))],
            axum::Json(json!({ "order_id": id, "owner": owner, "item": item })),
        )
            .into_response()
    })
}

mod answers;
mod recover;
mod replay;
mod wire;
