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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_repeat_gets_the_stored_response_and_runs_nothing() {
    let shop = Shop::new().await;
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let api = Api::new(&url);
    let order = json!({ "item": "book" });

    let first = api
        .post(Some("alice"), Some("\"k-1\""), order.clone())
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    let again = api
        .post(Some("alice"), Some("\"k-1\""), order.clone())
        .await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(again.headers["location"], first.headers["location"]);
    assert_eq!(again.headers["content-type"], "application/json");
    assert!(
        again.headers.get("set-cookie").is_none(),
        "cookies are never replayed"
    );
    // A bare key is the same key as its structured-field string.
    let bare = api.post(Some("alice"), Some("k-1"), order).await;
    assert!(bare.replayed());
    assert_eq!(shop.rows().await, 1);
}

/// An operator finds a request's record from what the client knows: its caller and the key it
/// sent (the store holds only a hash of both).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_layer_record_is_found_by_its_caller_and_key() {
    let shop = Shop::new().await;
    let store = store().await;
    let api = Api::new(&start(&shop, builder(&store).build().unwrap()).await);
    let sent = api
        .post(
            Some("alice"),
            Some("\"order-77\""),
            json!({ "item": "desk" }),
        )
        .await;
    assert_eq!(sent.status, StatusCode::CREATED);
    for key in ["\"order-77\"", "order-77"] {
        let found = idem::admin::inspect_http(&store, "HTTP", Some("alice"), key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{key}: alice's record"));
        assert_eq!(found.status, idem::Status::Succeeded);
        assert_eq!(
            found.key,
            idem::http_record_key(Some("alice"), key).unwrap()
        );
        assert_eq!(
            found.origin(),
            Some("POST /orders"),
            "the route it came from"
        );
    }
    let other = idem::admin::inspect_http(&store, "HTTP", Some("bob"), "order-77")
        .await
        .unwrap();
    assert!(other.is_none(), "another caller's key is another record");
    assert!(matches!(
        idem::admin::inspect_http(&store, "HTTP", Some("alice"), "two words").await,
        Err(IdemError::InvalidKey { .. })
    ));
}

/// A layer record says which route it came from: axum's route template, not the path with its
/// ids, and a repeat to that route still replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_layer_record_keeps_its_method_and_route_template() {
    let store = store().await;
    let app = Router::new()
        .route(
            "/orders/{id}/pay",
            post(|| async { (StatusCode::CREATED, "paid") }),
        )
        .layer(builder(&store).build().unwrap());
    let base = serve(app).await;
    let client = reqwest::Client::new();
    let pay = || {
        client
            .post(format!("{base}/orders/7/pay"))
            .header(USER, "alice")
            .header("idempotency-key", "\"pay-7\"")
            .send()
    };
    let first = pay().await.unwrap();
    assert_eq!(first.status().as_u16(), 201);
    let record = idem::admin::inspect_http(&store, "HTTP", Some("alice"), "pay-7")
        .await
        .unwrap()
        .expect("alice's record");
    assert_eq!(record.origin(), Some("POST /orders/{id}/pay"));
    let again = pay().await.unwrap();
    assert_eq!(again.status().as_u16(), 201);
    assert!(
        again.headers().contains_key("idempotent-replayed"),
        "{:?}",
        again.headers()
    );
}

/// A response kept a moment while its key stays used: the repeat within it replays, a late one
/// is `410 Gone` with its own problem type, and neither runs the handler; another body under the
/// key is still a mismatch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_repeat_after_the_response_was_dropped_is_gone_and_runs_nothing() {
    let shop = Shop::new().await;
    let clock = idem::TestClock::new();
    let store = store().await.with_test_clock(clock.clone());
    let layer = builder(&store)
        .ttl(Duration::from_secs(30 * 24 * 3600))
        .result_ttl(Duration::from_secs(24 * 3600))
        .build()
        .unwrap();
    let api = Api::new(&start(&shop, layer).await);
    let order = json!({ "item": "lamp" });
    let first = api.post(Some("alice"), Some("late-1"), order.clone()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    clock.advance(Duration::from_secs(23 * 3600));
    let again = api.post(Some("alice"), Some("late-1"), order.clone()).await;
    assert!(again.replayed() && again.body == first.body);
    clock.advance(Duration::from_secs(2 * 3600));
    let late = api.post(Some("alice"), Some("late-1"), order).await;
    assert_eq!(late.status, StatusCode::GONE, "{:?}", late.body);
    assert_eq!(late.problem(), "urn:idem:problem:result-expired");
    assert!(late.headers.get("retry-after").is_none());
    let other = api
        .post(Some("alice"), Some("late-1"), json!({ "item": "sofa" }))
        .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(shop.rows().await, 1, "the handler ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_duplicates_run_once() {
    let shop = Shop::new().await;
    shop.slow_ms.store(300, Ordering::SeqCst);
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let api = Api::new(&url);
    let mut created = Vec::new();
    let mut in_progress = 0;
    for reply in api.released_together(64, "storm").await {
        match reply.status {
            StatusCode::CREATED => created.push(reply.body["order_id"].as_i64().unwrap()),
            StatusCode::CONFLICT => {
                assert_eq!(reply.problem(), "urn:idem:problem:in-progress");
                let after: u64 = reply.headers["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!((1..=30).contains(&after), "{after}");
                in_progress += 1;
            }
            other => panic!("unexpected {other}: {:?}", reply.body),
        }
    }
    assert_eq!(shop.rows().await, 1, "64 duplicates, one order");
    assert!(!created.is_empty());
    assert!(created.iter().all(|id| *id == created[0]));
    assert_eq!(created.len() + in_progress, 64);
    // Once it finished, every repeat is a replay of that one order.
    let after = api
        .post(Some("alice"), Some("storm"), json!({ "item": "tv" }))
        .await;
    assert!(after.replayed());
    assert_eq!(after.body["order_id"].as_i64().unwrap(), created[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_problems_with_the_documented_statuses() {
    let shop = Shop::new().await;
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let api = Api::new(&url);
    let order = json!({ "item": "pen" });

    let missing = api.post(Some("alice"), None, order.clone()).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.problem(), "urn:idem:problem:missing-key");

    for bad in ["\"open", "two words", &"k".repeat(256)] {
        let reply = api.post(Some("alice"), Some(bad), order.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(reply.problem(), "urn:idem:problem:invalid-key");
    }

    let nobody = api.post(None, Some("k"), order.clone()).await;
    assert_eq!(nobody.status, StatusCode::UNAUTHORIZED);
    assert_eq!(nobody.problem(), "urn:idem:problem:no-principal");

    let first = api.post(Some("alice"), Some("k"), order).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let other = api
        .post(Some("alice"), Some("k"), json!({ "item": "ink" }))
        .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.problem(), "urn:idem:problem:payload-mismatch");
    assert_eq!(other.body["status"], 422);

    // Methods the layer does not cover pass through untouched, without a key.
    let list = api
        .client
        .get(format!("{url}/orders"))
        .send()
        .await
        .unwrap();
    assert_eq!(list.status().as_u16(), 200);
    assert_eq!(list.text().await.unwrap(), "list");

    let huge = api
        .client
        .post(format!("{url}/orders"))
        .header(USER, "alice")
        .header("idempotency-key", "huge")
        .body(vec![b' '; (1 << 20) + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(huge.status().as_u16(), 413);
    assert_eq!(shop.rows().await, 1, "only the first order ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_while_the_first_runs_is_told_to_retry_later() {
    let shop = Shop::new().await;
    shop.slow_ms.store(1500, Ordering::SeqCst);
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let (first, repeat) = Api::new(&url)
        .overlapping("slow", "car", Duration::from_millis(300))
        .await;
    assert_eq!(repeat.status, StatusCode::CONFLICT);
    assert_eq!(repeat.problem(), "urn:idem:problem:in-progress");
    assert!(repeat.headers.contains_key("retry-after"));
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(shop.rows().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_a_repeat_gets_the_first_response_when_it_is_ready() {
    let shop = Shop::new().await;
    shop.slow_ms.store(800, Ordering::SeqCst);
    let layer = builder(&store().await)
        .wait(Duration::from_secs(5))
        .heartbeat(Duration::from_secs(5))
        .build()
        .unwrap();
    let url = start(&shop, layer).await;
    let (first, repeat) = Api::new(&url)
        .overlapping("w", "bike", Duration::from_millis(200))
        .await;
    assert_eq!(repeat.status, StatusCode::CREATED, "{:?}", repeat.body);
    assert!(repeat.replayed());
    assert_eq!(repeat.body, first.body);
    assert_eq!(shop.rows().await, 1);
    let err = builder(&store().await)
        .heartbeat(Duration::from_secs(60))
        .build()
        .err()
        .unwrap();
    assert!(err.to_string().contains("heartbeat"), "{err}");
}

/// A gateway that gives up on a slow request that then succeeds, and retries. The handler
/// is not cancelled with the first connection, so the retry replays its response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_client_timeout_gets_the_response_of_the_run_it_gave_up_on() {
    let shop = Shop::new().await;
    shop.slow_ms.store(600, Ordering::SeqCst);
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(150))
        .build()
        .unwrap();
    let gave_up = impatient
        .post(format!("{url}/orders"))
        .header(USER, "alice")
        .header("idempotency-key", "gw-1")
        .json(&json!({ "item": "sofa" }))
        .send()
        .await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()));
    shop.slow_ms.store(0, Ordering::SeqCst);
    let api = Api::new(&url);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let retry = loop {
        let reply = api
            .post(Some("alice"), Some("gw-1"), json!({ "item": "sofa" }))
            .await;
        if reply.status != StatusCode::CONFLICT || tokio::time::Instant::now() > deadline {
            break reply;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
    assert!(retry.replayed(), "the first run finished and was stored");
    assert_eq!(shop.rows().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_not_stored_and_large_responses_are_not_replayed() {
    let shop = Shop::new().await;
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let api = Api::new(&url);

    shop.fail_next.store(1, Ordering::SeqCst);
    let failed = api
        .post(Some("alice"), Some("retry-me"), json!({ "item": "a" }))
        .await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    let retried = api
        .post(Some("alice"), Some("retry-me"), json!({ "item": "a" }))
        .await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed(), "a 5xx is not stored: the retry runs");
    assert_eq!(shop.rows().await, 1);

    let big = api
        .post(Some("alice"), Some("big"), json!({ "item": "big" }))
        .await;
    assert_eq!(big.status, StatusCode::CREATED);
    assert_eq!(
        big.body["item"].as_str().unwrap().len(),
        4096,
        "its own client gets all of it"
    );
    let repeat = api
        .post(Some("alice"), Some("big"), json!({ "item": "big" }))
        .await;
    assert_eq!(repeat.status, StatusCode::CONFLICT);
    assert_eq!(repeat.problem(), "urn:idem:problem:response-not-kept");
    assert!(!repeat.headers.contains_key("retry-after"));
    assert_eq!(shop.rows().await, 2, "the large order ran once");
}

/// A refusal the client can fix (415 for a wrong `Content-Type`, 400 for JSON that does not
/// parse) is not stored: the same key sent again, fixed, runs the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_the_client_can_fix_is_not_stored() {
    let shop = Shop::new().await;
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let api = Api::new(&url);
    let order = r#"{"item":"pen"}"#;
    let wrong_type = api.post_raw("fix-me", "text/plain", order, &[]).await;
    assert_eq!(wrong_type.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let malformed = api
        .post_raw("fix-me", "application/json", r#"{"item":"#, &[])
        .await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    assert!(!malformed.replayed(), "the 415 was not kept");
    let fixed = api.post_raw("fix-me", "application/json", order, &[]).await;
    assert_eq!(fixed.status, StatusCode::CREATED, "{:?}", fixed.body);
    assert!(!fixed.replayed(), "the 400 was not kept: the handler ran");
    let again = api.post_raw("fix-me", "application/json", order, &[]).await;
    assert!(again.replayed());
    assert_eq!(again.body["order_id"], fixed.body["order_id"]);
    assert_eq!(shop.rows().await, 1);
}

/// The same JSON with members in another order and other spacing is the same request (canonical
/// JSON in the fingerprint); byte for byte on request. The `Content-Type` and any header named
/// with `fingerprint_header` count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fingerprint_reads_json_canonically_and_counts_the_content_type() {
    let shop = Shop::new().await;
    let layer = builder(&store().await)
        .fingerprint_header(HeaderName::from_static("api-version"))
        .build()
        .unwrap();
    let api = Api::new(&start(&shop, layer).await);
    let v1 = [("api-version", "1")];
    let first = api
        .post_raw(
            "json",
            "application/json",
            r#"{"item":"pen","note":"a b"}"#,
            &v1,
        )
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let reordered = api
        .post_raw(
            "json",
            "application/json; charset=utf-8",
            "{ \"note\" : \"a b\",\n  \"item\" : \"pen\" }",
            &v1,
        )
        .await;
    assert!(reordered.replayed(), "{:?}", reordered.body);
    assert_eq!(reordered.body["order_id"], first.body["order_id"]);
    let other_version = api
        .post_raw(
            "json",
            "application/json",
            r#"{"item":"pen","note":"a b"}"#,
            &[("api-version", "2")],
        )
        .await;
    assert_eq!(other_version.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other_version.problem(), "urn:idem:problem:payload-mismatch");
    let other_value = api
        .post_raw(
            "json",
            "application/json",
            r#"{"item":"pen","note":"ab"}"#,
            &v1,
        )
        .await;
    assert_eq!(other_value.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(shop.rows().await, 1);

    let exact = Shop::new().await;
    let layer = builder(&store().await).byte_exact_bodies().build().unwrap();
    let api = Api::new(&start(&exact, layer).await);
    let first = api
        .post_raw(
            "json",
            "application/json",
            r#"{"item":"pen","note":"a b"}"#,
            &[],
        )
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let reordered = api
        .post_raw(
            "json",
            "application/json",
            r#"{"note":"a b","item":"pen"}"#,
            &[],
        )
        .await;
    assert_eq!(reordered.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(exact.rows().await, 1);
}

/// A response with `Cache-Control: no-store` is not stored: its key is released and the next
/// request with it runs the handler again. A storage policy may keep more (or less).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_store_response_releases_its_key_and_the_policy_decides_the_rest() {
    let runs = Arc::new(AtomicU32::new(0));
    let app = |runs: Arc<AtomicU32>| {
        Router::new().route(
            "/orders",
            post(move |body: String| {
                let runs = runs.clone();
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst);
                    match body.as_str() {
                        "quote" => (
                            StatusCode::OK,
                            [("cache-control", "private, No-Store")],
                            format!("quote {n}"),
                        )
                            .into_response(),
                        _ => (StatusCode::NOT_FOUND, format!("missing {n}")).into_response(),
                    }
                }
            }),
        )
    };
    let store = store().await;
    let url = serve(app(runs.clone()).layer(builder(&store).build().unwrap())).await;
    let api = Api::new(&url);
    for _ in 0..2 {
        let quote = api.post_raw("q", "text/plain", "quote", &[]).await;
        assert_eq!(quote.status, StatusCode::OK);
        assert!(!quote.replayed());
        let missing = api.post_raw("m", "text/plain", "missing", &[]).await;
        assert_eq!(missing.status, StatusCode::NOT_FOUND);
        assert!(!missing.replayed(), "404 is not kept by default");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4, "every request ran");

    let kept_404 = Arc::new(AtomicU32::new(0));
    let layer = builder(&store)
        .biz("HTTP404")
        .store_if(|s| s == StatusCode::NOT_FOUND || idem::http::stored_by_default(s))
        .build()
        .unwrap();
    let api = Api::new(&serve(app(kept_404.clone()).layer(layer)).await);
    let first = api.post_raw("m", "text/plain", "missing", &[]).await;
    let again = api.post_raw("m", "text/plain", "missing", &[]).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(kept_404.load(Ordering::SeqCst), 1);
}

/// 50 duplicates of a 50 ms handler released together: each one told to come back is told about
/// a second (the route's recent duration), not the lease's 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retry_after_follows_the_handlers_duration_not_the_lease() {
    let shop = Shop::new().await;
    shop.slow_ms.store(50, Ordering::SeqCst);
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let api = Api::new(&url);
    for i in 0..3 {
        let warm = api
            .post(
                Some("alice"),
                Some(&format!("warm-{i}")),
                json!({ "item": "w" }),
            )
            .await;
        assert_eq!(warm.status, StatusCode::CREATED);
    }
    let mut told = Vec::new();
    for reply in api.released_together(50, "hot").await {
        if reply.status == StatusCode::CONFLICT {
            told.push(
                reply.headers["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse::<u64>()
                    .unwrap(),
            );
        } else {
            assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
        }
    }
    assert!(told.iter().all(|s| (1..=2).contains(s)), "{told:?}");
    assert_eq!(
        shop.rows().await,
        4,
        "3 warm-up orders and one for 50 duplicates"
    );
}

/// `check()` at start-up finds a store that was never migrated; a migrated one passes.
#[tokio::test]
async fn check_at_start_up_finds_a_store_that_was_never_migrated() {
    let bare = SqliteStore::in_memory().await.unwrap();
    let layer = builder(&bare).build().unwrap();
    let err = layer.check().await.unwrap_err();
    assert!(matches!(err, IdemError::StoreSchema { .. }), "{err:?}");
    assert!(err.to_string().contains("migrate"), "{err}");
    bare.migrate().await.unwrap();
    builder(&bare).build().unwrap().check().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_may_come_from_a_body_field_when_a_proxy_strips_the_header() {
    let shop = Shop::new().await;
    let layer = builder(&store().await)
        .body_key("/request_id")
        .build()
        .unwrap();
    let url = start(&shop, layer).await;
    let api = Api::new(&url);
    let order = json!({ "item": "lamp", "request_id": "r-77" });
    let first = api.post(Some("alice"), None, order.clone()).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = api.post(Some("alice"), None, order).await;
    assert!(again.replayed());
    let bad = api
        .post(Some("alice"), None, json!({ "request_id": [1] }))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(shop.rows().await, 1);
}

/// Client B sending client A's key and body runs as its own request and sees nothing of
/// A's response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_caller_with_the_same_key_never_sees_the_first_callers_response() {
    let shop = Shop::new().await;
    let url = start(&shop, builder(&store().await).build().unwrap()).await;
    let api = Api::new(&url);
    let order = json!({ "item": "secret-plans" });
    let alice = api.post(Some("alice"), Some("shared"), order.clone()).await;
    let bob = api.post(Some("bob"), Some("shared"), order.clone()).await;
    assert_eq!(bob.status, StatusCode::CREATED);
    assert!(!bob.replayed(), "bob's request ran as his own");
    assert_ne!(bob.body["order_id"], alice.body["order_id"]);
    assert_eq!(bob.body["owner"], "bob");
    assert!(!bob.body.to_string().contains("alice"));
    let alice_again = api.post(Some("alice"), Some("shared"), order).await;
    assert!(alice_again.replayed());
    assert_eq!(alice_again.body, alice.body);
    assert_eq!(shop.rows().await, 2);
}

#[tokio::test]
async fn a_layer_without_a_principal_is_refused_at_start_up() {
    let store = store().await;
    let err = IdempotencyLayer::builder(store.clone())
        .build()
        .err()
        .unwrap();
    assert!(
        matches!(&err, IdemError::InvalidOptions { reason } if reason.contains("Principal::unscoped")),
        "{err}"
    );
    let err = IdempotencyLayer::builder(store.clone())
        .principal(Principal::unscoped(" "))
        .build()
        .err()
        .unwrap();
    assert!(err.to_string().contains("needs a reason"), "{err}");
    let ok = IdempotencyLayer::builder(store.clone())
        .principal(Principal::unscoped("one internal caller behind mutual TLS"))
        .build();
    assert!(ok.is_ok());
    let err = builder(&store)
        .cap_per_principal(0, Duration::from_secs(1))
        .build()
        .err()
        .unwrap();
    assert!(err.to_string().contains("cap of 0"), "{err}");
}

/// A cap on new records per caller per window, 429 with Retry-After before anything is
/// written; replays and other callers are not affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_over_its_cap_gets_429_before_anything_is_written() {
    let shop = Shop::new().await;
    let store = store().await;
    let layer = builder(&store)
        .cap_per_principal(3, Duration::from_secs(60))
        .build()
        .unwrap();
    let url = start(&shop, layer).await;
    let api = Api::new(&url);
    for i in 0..3 {
        let reply = api
            .post(
                Some("mallory"),
                Some(&format!("m{i}")),
                json!({ "item": i }),
            )
            .await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    let over = api
        .post(Some("mallory"), Some("m3"), json!({ "item": 3 }))
        .await;
    assert_eq!(over.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(over.problem(), "urn:idem:problem:too-many-keys");
    let after: u64 = over.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&after), "{after}");
    let record = idem::Store::load(&store, "HTTP", &idem_record_key("mallory", "m3"))
        .await
        .unwrap();
    assert!(
        record.is_none(),
        "nothing was written for the refused request"
    );
    let replay = api
        .post(Some("mallory"), Some("m0"), json!({ "item": 0 }))
        .await;
    assert!(replay.replayed(), "a replay is not a new record");
    let other = api
        .post(Some("alice"), Some("m3"), json!({ "item": 3 }))
        .await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert_eq!(shop.rows().await, 4);
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

/// Submit tokens over HTTP, and their subject binding end to end: a token issued to alice cannot
/// be spent by bob; alice spends it once; a 5xx puts it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_tokens_are_issued_to_a_caller_and_spent_once() {
    let tokens: Arc<dyn TokenStore> = Arc::new(MemoryTokens::new());
    let principal = Principal::header(HeaderName::from_static(USER));
    let runs = Arc::new(AtomicU32::new(0));
    let fail_next = Arc::new(AtomicU32::new(0));
    let submit = {
        let (runs, fail_next) = (Arc::clone(&runs), Arc::clone(&fail_next));
        post(move || async move {
            if fail_next
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return (StatusCode::SERVICE_UNAVAILABLE, "try later").into_response();
            }
            runs.fetch_add(1, Ordering::SeqCst);
            (StatusCode::OK, "submitted").into_response()
        })
    };
    let app = Router::new()
        .route(
            "/submit",
            submit.layer(TokenGuardLayer::shared(
                Arc::clone(&tokens),
                principal.clone(),
            )),
        )
        .route(
            "/tokens",
            TokenEndpoint::shared(tokens, principal)
                .ttl(Duration::from_secs(60))
                .unwrap()
                .route(),
        );
    let url = serve(app).await;
    let client = reqwest::Client::new();
    let issue = |user: &'static str| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let reply = client
                .post(format!("{url}/tokens"))
                .header(USER, user)
                .send()
                .await
                .unwrap();
            assert_eq!(reply.status().as_u16(), 201);
            let body: Value = reply.json().await.unwrap();
            assert_eq!(body["header"], "x-idem-token");
            body["token"].as_str().unwrap().to_owned()
        }
    };
    let submit = |user: Option<&'static str>, token: Option<String>| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let mut req = client.post(format!("{url}/submit"));
            if let Some(user) = user {
                req = req.header(USER, user);
            }
            if let Some(token) = token {
                req = req.header("x-idem-token", token);
            }
            let reply = req.send().await.unwrap();
            let status = reply.status().as_u16();
            let body = reply.text().await.unwrap();
            (status, body)
        }
    };

    let token = issue("alice").await;
    let (status, body) = submit(Some("bob"), Some(token.clone())).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("token-invalid") && body.contains("another subject"),
        "{body}"
    );
    assert_eq!(submit(Some("alice"), None).await.0, 400);
    assert_eq!(submit(None, Some(token.clone())).await.0, 401);
    let (status, body) = submit(Some("alice"), Some(token.clone())).await;
    assert_eq!((status, body.as_str()), (200, "submitted"));
    let (status, body) = submit(Some("alice"), Some(token.clone())).await;
    assert_eq!(status, 409);
    assert!(body.contains("urn:idem:problem:token-used"), "{body}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A double click: of two concurrent submits with one token, one runs.
    let token = issue("alice").await;
    let (a, b) = tokio::join!(
        submit(Some("alice"), Some(token.clone())),
        submit(Some("alice"), Some(token))
    );
    let mut statuses = [a.0, b.0];
    statuses.sort();
    assert_eq!(statuses, [200, 409]);
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // The handler fails with a 5xx: the token is put back and the user can submit again.
    let token = issue("alice").await;
    fail_next.store(1, Ordering::SeqCst);
    assert_eq!(submit(Some("alice"), Some(token.clone())).await.0, 503);
    assert_eq!(submit(Some("alice"), Some(token)).await.0, 200);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
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

/// A cookie (a session), a hop-by-hop or framing header, a credential and the layer's
/// own header can never be kept: `keep_header` with one is refused when the layer is built.
#[tokio::test]
async fn headers_that_can_never_be_kept_are_refused_at_build() {
    let store = store().await;
    for name in [
        "set-cookie",
        "set-cookie2",
        "authorization",
        "proxy-authorization",
        "cookie",
        "authentication-info",
        "proxy-authentication-info",
        "proxy-authenticate",
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "content-length",
        "idempotent-replayed",
    ] {
        let err = builder(&store)
            .keep_header(HeaderName::from_static(name))
            .build()
            .err()
            .unwrap_or_else(|| panic!("keep_header({name}) was accepted"));
        assert!(
            matches!(&err, IdemError::InvalidOptions { reason } if reason.contains(&format!("`{name}` header is never kept, since "))),
            "{name}: {err}"
        );
    }
    let err = builder(&store)
        .keep_header(axum::http::header::SET_COOKIE)
        .build()
        .err()
        .unwrap();
    assert!(err.to_string().contains("session"), "it says why: {err}");
    // A challenge carries no secret: it may be kept.
    assert!(
        builder(&store)
            .keep_header(axum::http::header::WWW_AUTHENTICATE)
            .build()
            .is_ok()
    );
}

/// A header kept by default and named again is still replayed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_kept_twice_is_replayed_once() {
    let shop = Shop::new().await;
    let layer = builder(&store().await)
        .keep_header(axum::http::header::LOCATION)
        .build()
        .unwrap();
    let api = Api::new(&start(&shop, layer).await);
    let first = api
        .post(Some("alice"), Some("loc"), json!({ "item": "map" }))
        .await;
    let again = api
        .post(Some("alice"), Some("loc"), json!({ "item": "map" }))
        .await;
    assert!(again.replayed());
    let locations: Vec<_> = again.headers.get_all("location").iter().collect();
    assert_eq!(locations, [&first.headers["location"]]);
}

/// Several Idempotency-Key lines are one comma-joined value (RFC 9110 §5.3), not a key,
/// also when the lines are equal: 400 `invalid-key`, the handler does not run, nothing is stored.
/// The same for a body key present twice, and several lines of the caller's header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_key_lines_are_an_invalid_key_and_run_nothing() {
    let shop = Shop::new().await;
    let store = store().await;
    let layer = builder(&store).body_key("/request_id").build().unwrap();
    let url = start(&shop, layer).await;
    let body = r#"{"item":"gem"}"#;
    for lines in [
        ["idempotency-key: \"a\"", "idempotency-key: \"b\""],
        ["idempotency-key: \"a\"", "idempotency-key: \"a\""],
        ["idempotency-key: a", "idempotency-key: a"],
    ] {
        let request = raw_post(&["x-user: alice", lines[0], lines[1]], body.len(), body);
        let reply = raw(&url, &request, false).await;
        assert_eq!(reply.status, 400, "{lines:?}: {:?}", reply.body);
        assert_eq!(reply.problem(), "urn:idem:problem:invalid-key");
        let detail = reply.body["detail"].as_str().unwrap();
        assert!(
            detail.contains("2 Idempotency-Key header lines") && detail.contains("RFC 9110"),
            "{detail}"
        );
    }
    // What a proxy makes of two lines: one line, comma-joined.
    for joined in ["a,b", "a, b", "\"a\", \"b\""] {
        let line = format!("idempotency-key: {joined}");
        let request = raw_post(&["x-user: alice", &line], body.len(), body);
        let reply = raw(&url, &request, false).await;
        assert_eq!(reply.status, 400, "{joined}: {:?}", reply.body);
        assert_eq!(reply.problem(), "urn:idem:problem:invalid-key");
    }
    // The body key, present twice (equal or not), is the same ambiguity.
    for twice in [
        r#"{"item":"gem","request_id":"r1","request_id":"r2"}"#,
        r#"{"item":"gem","request_id":"r1","request_id":"r1"}"#,
    ] {
        let reply = raw(
            &url,
            &raw_post(&["x-user: alice"], twice.len(), twice),
            false,
        )
        .await;
        assert_eq!(reply.status, 400, "{twice}: {:?}", reply.body);
        assert_eq!(reply.problem(), "urn:idem:problem:invalid-key");
        assert!(
            reply.body["detail"]
                .as_str()
                .unwrap()
                .contains("/request_id"),
            "{:?}",
            reply.body
        );
    }
    // Two callers: a gateway that appended its line must not let the client's first line win.
    let request = raw_post(
        &["x-user: mallory", "x-user: alice", "idempotency-key: k"],
        body.len(),
        body,
    );
    let reply = raw(&url, &request, false).await;
    assert_eq!(reply.status, 401, "{:?}", reply.body);
    assert_eq!(reply.problem(), "urn:idem:problem:no-principal");
    assert_eq!(shop.rows().await, 0, "the handler never ran");
    assert_eq!(records(&store).await, 0, "nothing was stored");
    // One line is still a key.
    let request = raw_post(
        &["x-user: alice", "idempotency-key: \"a\""],
        body.len(),
        body,
    );
    assert_eq!(raw(&url, &request, false).await.status, 201);
    assert_eq!(records(&store).await, 1);
}

/// A body shorter than its Content-Length (the client stopped sending) is the client's
/// fault, not an over-size body: 400 `request-unreadable`, the handler does not run, nothing is
/// stored. A body over the limit is still 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_cut_short_is_a_bad_request_and_runs_nothing() {
    let shop = Shop::new().await;
    let store = store().await;
    let url = start(&shop, builder(&store).build().unwrap()).await;
    let body = r#"{"item":"half"}"#;
    let request = raw_post(&["x-user: alice", "idempotency-key: cut"], 100, body);
    let reply = raw(&url, &request, true).await;
    assert_eq!(reply.status, 400, "{:?}", reply.body);
    assert_eq!(reply.problem(), "urn:idem:problem:request-unreadable");
    assert_eq!(reply.body["status"], 400);
    assert_eq!(shop.rows().await, 0, "the handler never ran");
    assert_eq!(records(&store).await, 0, "nothing was stored");

    let huge = Api::new(&url)
        .client
        .post(format!("{url}/orders"))
        .header(USER, "alice")
        .header("idempotency-key", "huge")
        .body(vec![b' '; (1 << 20) + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(huge.status().as_u16(), 413);
    let problem: Value = huge.json().await.unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:request-too-large");
    // Over the limit, also when the client then stops sending.
    let request = raw_post(
        &["x-user: alice", "idempotency-key: big-cut"],
        (2 << 20) + 7,
        &" ".repeat((1 << 20) + 1),
    );
    let reply = raw(&url, &request, true).await;
    assert_eq!(reply.status, 413, "{:?}", reply.body);
    assert_eq!(reply.problem(), "urn:idem:problem:request-too-large");
    assert_eq!(records(&store).await, 0);

    // The same request sent whole runs.
    let request = raw_post(&["x-user: alice", "idempotency-key: cut"], body.len(), body);
    assert_eq!(raw(&url, &request, false).await.status, 201);
    assert_eq!(shop.rows().await, 1);
}

/// Several X-Idem-Token lines spend nothing: 400, and the token still works once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_token_lines_spend_nothing() {
    let tokens: Arc<dyn TokenStore> = Arc::new(MemoryTokens::new());
    let principal = Principal::header(HeaderName::from_static(USER));
    let runs = Arc::new(AtomicU32::new(0));
    let submit = {
        let runs = Arc::clone(&runs);
        post(move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            "submitted"
        })
    };
    let app = Router::new().route(
        "/submit",
        submit.layer(TokenGuardLayer::shared(Arc::clone(&tokens), principal)),
    );
    let url = serve(app).await;
    let first = tokens
        .issue(Duration::from_secs(60), Some("alice"))
        .await
        .unwrap();
    let second = tokens
        .issue(Duration::from_secs(60), Some("alice"))
        .await
        .unwrap();
    let request = |lines: &[&str]| {
        let mut request = String::from(
            "POST /submit HTTP/1.1\r\nhost: idem\r\nconnection: close\r\nx-user: alice\r\n",
        );
        for line in lines {
            request.push_str(&format!("x-idem-token: {line}\r\n"));
        }
        request.push_str("content-length: 0\r\n\r\n");
        request
    };
    for lines in [[&first, &second], [&first, &first]] {
        let reply = raw(&url, &request(&[lines[0], lines[1]]), false).await;
        assert_eq!(reply.status, 400, "{:?}", reply.body);
        assert_eq!(reply.problem(), "urn:idem:problem:token-invalid");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(raw(&url, &request(&[&first]), false).await.status, 200);
    assert_eq!(raw(&url, &request(&[&second]), false).await.status, 200);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "both tokens were still unspent"
    );
}

/// Every duration of the layer and of the token endpoint is checked at build: out of
/// its range it is `InvalidOptions` naming it (no panic per request, as `wait(Duration::MAX)`
/// was: `Instant + Duration::MAX` overflows); at the maximum the layer works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_out_of_range_are_refused_at_build_and_the_maximum_works() {
    use idem::MAX_DURATION;
    let store = store().await;
    let ns = Duration::from_nanos(1);
    let ms = Duration::from_millis(1);
    let refused = |b: IdempotencyBuilder, what: &str| {
        let err = b
            .build()
            .err()
            .unwrap_or_else(|| panic!("{what}: accepted"));
        assert!(
            matches!(&err, IdemError::InvalidOptions { reason } if reason.contains(what)),
            "{what}: {err}"
        );
    };
    let accepted = |b: IdempotencyBuilder, what: &str| {
        if let Err(e) = b.build() {
            panic!("{what}: {e}");
        }
    };
    for bad in [Duration::ZERO, ns] {
        refused(builder(&store).ttl(bad), "ttl");
        refused(builder(&store).lease(bad), "lease");
        refused(builder(&store).store_timeout(bad), "store timeout");
        refused(builder(&store).cap_per_principal(5, bad), "cap's window");
    }
    for too_long in [MAX_DURATION + ns, Duration::MAX] {
        refused(builder(&store).ttl(too_long), "the ttl");
        refused(builder(&store).ttl(too_long).lease(too_long), "the lease");
        refused(builder(&store).wait(too_long), "the wait");
        refused(builder(&store).store_timeout(too_long), "the store timeout");
        refused(builder(&store).heartbeat(too_long), "heartbeat");
        refused(
            builder(&store).cap_per_principal(5, too_long),
            "cap's window",
        );
    }
    // The lease is shorter than the ttl, so never the maximum itself.
    refused(
        builder(&store).ttl(MAX_DURATION).lease(MAX_DURATION),
        "lease",
    );
    for bad in [Duration::ZERO, ns, idem::DEFAULT_LEASE] {
        refused(builder(&store).heartbeat(bad), "heartbeat");
    }
    for bad in [Duration::ZERO, ns] {
        refused(builder(&store).result_ttl(bad), "result ttl");
    }
    refused(
        builder(&store)
            .ttl(Duration::from_secs(60))
            .result_ttl(Duration::from_secs(61)),
        "result ttl",
    );
    accepted(builder(&store).result_ttl(ms), "a 1 ms result ttl");
    accepted(
        builder(&store).ttl(MAX_DURATION).result_ttl(MAX_DURATION),
        "a result kept as long as the longest ttl",
    );
    accepted(builder(&store).lease(ms), "a 1 ms lease");
    accepted(builder(&store).store_timeout(ms), "a 1 ms store timeout");
    accepted(
        builder(&store).store_timeout(MAX_DURATION),
        "the longest store timeout",
    );
    accepted(builder(&store).heartbeat(ms), "a 1 ms heartbeat");
    accepted(builder(&store).wait(Duration::ZERO), "no wait");
    accepted(builder(&store).wait(ns), "a 1 ns wait");
    accepted(builder(&store).cap_per_principal(5, ms), "a 1 ms window");
    accepted(
        builder(&store)
            .ttl(MAX_DURATION)
            .lease(MAX_DURATION - Duration::from_secs(1)),
        "the longest lease",
    );

    let endpoint = || {
        TokenEndpoint::new(
            MemoryTokens::new(),
            Principal::header(HeaderName::from_static(USER)),
        )
    };
    for bad in [Duration::ZERO, ns, MAX_DURATION + ns, Duration::MAX] {
        let err = endpoint()
            .ttl(bad)
            .err()
            .unwrap_or_else(|| panic!("{bad:?}"));
        assert!(
            matches!(&err, IdemError::InvalidOptions { reason } if reason.contains("token's ttl")),
            "{err}"
        );
    }
    assert!(endpoint().ttl(ms).is_ok());
    assert!(endpoint().ttl(MAX_DURATION).is_ok());

    // At the maximum: a record for ten years, a wait as long, a cap window as long.
    let shop = Shop::new().await;
    shop.slow_ms.store(400, Ordering::SeqCst);
    let layer = builder(&store)
        .ttl(MAX_DURATION)
        .lease(Duration::from_secs(30))
        .wait(MAX_DURATION)
        .cap_per_principal(100, MAX_DURATION)
        .build()
        .unwrap();
    let api = Api::new(&start(&shop, layer).await);
    let (first, repeat) = api
        .overlapping("decade", "clock", Duration::from_millis(100))
        .await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    assert!(repeat.replayed(), "{:?}", repeat.body);
    assert_eq!(repeat.body, first.body);
    shop.slow_ms.store(0, Ordering::SeqCst);
    let again = api
        .post(Some("alice"), Some("decade"), json!({ "item": "clock" }))
        .await;
    assert!(again.replayed());
    assert_eq!(shop.rows().await, 1);
    // And the longest lease the ttl allows claims and replays too.
    let layer = builder(&store)
        .biz("HTTP2")
        .ttl(MAX_DURATION)
        .lease(MAX_DURATION - Duration::from_secs(1))
        .build()
        .unwrap();
    let api = Api::new(&start(&shop, layer).await);
    let first = api
        .post(Some("alice"), Some("long-lease"), json!({ "item": "oak" }))
        .await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    let again = api
        .post(Some("alice"), Some("long-lease"), json!({ "item": "oak" }))
        .await;
    assert!(again.replayed(), "{:?}", again.body);
    assert_eq!(shop.rows().await, 2);
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

/// A handler that dies after writing its order (the process killed between the effect and the
/// mark; here the handler's task panics, which leaves the claim PROCESSING the same way). After
/// the lease, a retry with `recover` gets the order that was written, and the handler does not run
/// again; without `recover`, the documented behaviour of lease mode alone: it runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_died_after_its_effect_is_recovered_not_run_again() {
    // Long enough that the request after the death is still inside it on a loaded machine (a
    // 300 ms lease was once over before that request arrived, and it was taken over at once).
    const LEASE: Duration = Duration::from_secs(2);
    for with_recover in [true, false] {
        let shop = Shop::new().await;
        let db = shop.db.clone();
        let mut layer = builder(&store().await).lease(LEASE);
        if with_recover {
            layer = layer.recover(move |req: idem::http::RecoverRequest| {
                let db = db.clone();
                async move {
                    let body: Value = serde_json::from_slice(&req.body)?;
                    let owner = req.principal.unwrap_or_default();
                    Ok(order_of(&db, &owner, body["item"].as_str().unwrap_or("")).await)
                }
            });
        }
        let url = start(&shop, layer.build().unwrap()).await;
        let api = Api::new(&url);
        shop.die_next.store(1, Ordering::SeqCst);
        let died = api
            .client
            .post(format!("{url}/orders"))
            .header(USER, "alice")
            .header("idempotency-key", "crash-1")
            .json(&json!({ "item": "lamp" }))
            .send()
            .await;
        assert!(
            died.is_err(),
            "the connection died with the handler: {died:?}"
        );
        assert_eq!(shop.rows().await, 1, "its order was written");
        let early = api
            .post(Some("alice"), Some("crash-1"), json!({ "item": "lamp" }))
            .await;
        assert_eq!(
            early.status,
            StatusCode::CONFLICT,
            "within the lease: in progress"
        );
        tokio::time::sleep(LEASE + Duration::from_millis(200)).await;
        let retry = api
            .post(Some("alice"), Some("crash-1"), json!({ "item": "lamp" }))
            .await;
        assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
        if with_recover {
            assert_eq!(retry.body["order_id"], 1, "the order that was written");
            assert!(retry.replayed(), "the first request's answer");
            assert_eq!(shop.rows().await, 1, "no second order");
        } else {
            assert_eq!(retry.body["order_id"], 2, "without recover it runs again");
            assert_eq!(shop.rows().await, 2);
        }
        let again = api
            .post(Some("alice"), Some("crash-1"), json!({ "item": "lamp" }))
            .await;
        assert!(again.replayed());
        assert_eq!(again.body["order_id"], retry.body["order_id"]);
    }
}

/// A recover fn that cannot tell (its database is down) answers 503 `recover-failed` with
/// Retry-After and runs nothing; once it can tell, the next retry is recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recover_that_cannot_tell_answers_503_and_runs_nothing() {
    let shop = Shop::new().await;
    let db = shop.db.clone();
    let down = Arc::new(AtomicU32::new(1));
    let layer = {
        let down = down.clone();
        builder(&store().await)
            .lease(Duration::from_millis(300))
            .recover(move |req: idem::http::RecoverRequest| {
                let (db, down) = (db.clone(), down.clone());
                async move {
                    if down.load(Ordering::SeqCst) == 1 {
                        return Err("the orders database does not answer".into());
                    }
                    let body: Value = serde_json::from_slice(&req.body)?;
                    let owner = req.principal.unwrap_or_default();
                    Ok(order_of(&db, &owner, body["item"].as_str().unwrap_or("")).await)
                }
            })
            .build()
            .unwrap()
    };
    let url = start(&shop, layer).await;
    let api = Api::new(&url);
    shop.die_next.store(1, Ordering::SeqCst);
    let died = api
        .client
        .post(format!("{url}/orders"))
        .header(USER, "alice")
        .header("idempotency-key", "crash-2")
        .json(&json!({ "item": "desk" }))
        .send()
        .await;
    assert!(died.is_err());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let refused = api
        .post(Some("alice"), Some("crash-2"), json!({ "item": "desk" }))
        .await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        refused.problem().ends_with("recover-failed"),
        "{:?}",
        refused.body
    );
    assert!(refused.headers.contains_key("retry-after"));
    assert_eq!(shop.rows().await, 1, "nothing ran");
    down.store(0, Ordering::SeqCst);
    let retry = api
        .post(Some("alice"), Some("crash-2"), json!({ "item": "desk" }))
        .await;
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.body);
    assert_eq!(retry.body["order_id"], 1);
    assert_eq!(shop.rows().await, 1);
}

/// At shutdown, `drain().wait(deadline)` waits for the handlers the layer runs on their own tasks,
/// also those whose client went away, so their responses are stored before the process ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_waits_for_handlers_whose_clients_left() {
    let shop = Shop::new().await;
    shop.slow_ms.store(600, Ordering::SeqCst);
    let store = store().await;
    let layer = builder(&store).build().unwrap();
    let drain = layer.drain();
    let url = start(&shop, layer).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let gave_up = impatient
        .post(format!("{url}/orders"))
        .header(USER, "alice")
        .header("idempotency-key", "drain-1")
        .json(&json!({ "item": "chair" }))
        .send()
        .await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()));
    assert_eq!(drain.running(), 1, "the handler still runs");
    assert_eq!(drain.wait(Duration::from_millis(10)).await, Err(1));
    assert_eq!(drain.wait(Duration::from_secs(10)).await, Ok(()));
    assert_eq!(drain.running(), 0);
    assert_eq!(shop.rows().await, 1);
    assert_eq!(records(&store).await, 1, "its response was stored");
    let retry = Api::new(&url)
        .post(Some("alice"), Some("drain-1"), json!({ "item": "chair" }))
        .await;
    assert!(retry.replayed());
}
