//! The example service (`examples/shop.rs`) answers a scripted session over real HTTP with the
//! statuses its docs promise, on the embedded SQLite store and (with the `mysql` feature) on
//! MariaDB; then its `/metrics` endpoint is scraped for idem's metrics.

#![allow(dead_code)]

#[path = "../../examples/shop.rs"]
mod shop;

#[path = "contract/server.rs"]
mod server;

use std::sync::{Arc, OnceLock};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::{Value, json};

/// The process's one Prometheus recorder, installed before any idempotent call.
fn metrics() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| PrometheusBuilder::new().install_recorder().unwrap())
        .clone()
}

/// Both tests register the shop's store under one name: they take turns.
static ONE_SHOP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

struct Client {
    http: reqwest::Client,
    url: String,
    user: String,
}

impl Client {
    async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.url))
            .header("x-user-id", &self.user);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let reply = req.send().await.unwrap();
        let status = reply.status().as_u16();
        let replayed = reply.headers().get("idempotent-replayed").is_some();
        let text = reply.text().await.unwrap();
        let mut body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if replayed && let Some(map) = body.as_object_mut() {
            map.insert("_replayed".into(), Value::Bool(true));
        }
        (status, body)
    }
}

/// The session a client of the shop goes through, with the documented answers.
async fn script(url: String) {
    let user = server::unique("alice");
    let alice = Client {
        http: reqwest::Client::new(),
        url: url.clone(),
        user,
    };
    let order = json!({ "item": "book", "amount": 1200 });
    let key = [("idempotency-key", "\"checkout-1\"")];

    let (status, created) = alice
        .send("POST", "/orders", &key, Some(order.clone()))
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["status"], "WAIT_PAY");
    let no = created["order_no"].as_str().unwrap().to_owned();
    let (status, again) = alice
        .send("POST", "/orders", &key, Some(order.clone()))
        .await;
    assert_eq!(
        (status, again["order_no"].as_str()),
        (201, Some(no.as_str())),
        "a retry replays"
    );
    assert_eq!(again["_replayed"], true);
    let (status, _) = alice
        .send("POST", "/orders", &[], Some(order.clone()))
        .await;
    assert_eq!(status, 400, "no key");
    let (status, _) = alice
        .send(
            "POST",
            "/orders",
            &key,
            Some(json!({ "item": "pen", "amount": 1 })),
        )
        .await;
    assert_eq!(status, 422, "same key, other order");

    let bob = Client {
        http: reqwest::Client::new(),
        url: url.clone(),
        user: server::unique("bob"),
    };
    let (status, bobs) = bob.send("POST", "/orders", &key, Some(order.clone())).await;
    assert_eq!(status, 201);
    assert_ne!(
        bobs["order_no"], created["order_no"],
        "bob's key is his own"
    );
    let (status, _) = bob.send("GET", &format!("/orders/{no}"), &[], None).await;
    assert_eq!(status, 404, "bob cannot see alice's order");

    let pay = format!("/orders/{no}/pay");
    let (status, paid) = alice.send("POST", &pay, &[], None).await;
    assert_eq!((status, paid["status"].as_str()), (200, Some("PAID")));
    let (status, _) = alice.send("POST", &pay, &[], None).await;
    assert_eq!(status, 200, "paying twice is the same payment");

    let (status, token) = alice.send("POST", "/tokens", &[], None).await;
    assert_eq!(status, 201);
    let token = token["token"].as_str().unwrap().to_owned();
    let cancel = format!("/orders/{no}/cancel");
    let (status, refused) = alice
        .send("POST", &cancel, &[("x-idem-token", &token)], None)
        .await;
    assert_eq!(status, 409, "a paid order cannot be cancelled: {refused}");

    let (_, second) = alice
        .send(
            "POST",
            "/orders",
            &[("idempotency-key", "checkout-2")],
            Some(order),
        )
        .await;
    let second = second["order_no"].as_str().unwrap().to_owned();
    let (_, token) = alice.send("POST", "/tokens", &[], None).await;
    let token = token["token"].as_str().unwrap().to_owned();
    let (status, _) = bob
        .send(
            "POST",
            &format!("/orders/{second}/cancel"),
            &[("x-idem-token", &token)],
            None,
        )
        .await;
    assert_eq!(status, 400, "alice's token is not bob's");
    let cancel = format!("/orders/{second}/cancel");
    let (status, cancelled) = alice
        .send("POST", &cancel, &[("x-idem-token", &token)], None)
        .await;
    assert_eq!(
        (status, cancelled["status"].as_str()),
        (200, Some("CANCELLED"))
    );
    let (status, used) = alice
        .send("POST", &cancel, &[("x-idem-token", &token)], None)
        .await;
    assert_eq!(status, 409);
    assert_eq!(used["type"], "urn:idem:problem:token-used");

    let (status, first) = alice.send("GET", &format!("/orders/{no}"), &[], None).await;
    assert_eq!((status, first["status"].as_str()), (200, Some("PAID")));
}

/// Prometheus text exposition of idem's metrics, scraped from the service.
async fn scrape(url: &str) -> String {
    let reply = reqwest::get(format!("{url}/metrics")).await.unwrap();
    assert_eq!(reply.status().as_u16(), 200);
    reply.text().await.unwrap()
}

fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(name) && labels.iter().all(|l| line.contains(l)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shop_answers_a_session_and_exposes_its_metrics() {
    let _turn = ONE_SHOP.lock().await;
    let metrics = metrics();
    let path = std::env::temp_dir().join(format!("idem-shop-{}.db", std::process::id()));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let store = idem::SqliteStore::open(&path).await.unwrap();
    store.migrate().await.unwrap();
    let db = shop::Db::Sqlite(store.clone());
    let app = shop::app(
        Arc::new(store.clone()),
        db,
        Arc::new(store.tokens()),
        metrics.clone(),
    )
    .await
    .unwrap();
    let url = serve(app).await;
    script(url.clone()).await;

    let text = scrape(&url).await;
    let calls = |outcome: &str| {
        sample(
            &text,
            "idem_calls_total",
            &["biz=\"SHOP_HTTP\"", &format!("outcome=\"{outcome}\"")],
        )
    };
    assert!(calls("executed") >= 3.0, "{text}");
    assert!(calls("replayed") >= 1.0, "{text}");
    assert!(calls("mismatch") >= 1.0, "{text}");
    assert!(
        sample(&text, "idem_duplicates_total", &["biz=\"SHOP_HTTP\""]) >= 2.0,
        "{text}"
    );
    assert!(
        sample(
            &text,
            "idem_claim_seconds_count",
            &["biz=\"SHOP_HTTP\"", "store=\"sqlite\""]
        ) >= 5.0,
        "{text}"
    );
    assert!(
        sample(
            &text,
            "idem_calls_total",
            &["biz=\"OrderStatus\"", "outcome=\"executed\""]
        ) >= 2.0,
        "{text}"
    );
    assert!(
        sample(
            &text,
            "idem_token_ops_total",
            &["op=\"issue\"", "outcome=\"ok\""]
        ) >= 2.0,
        "{text}"
    );
    assert!(
        sample(
            &text,
            "idem_token_ops_total",
            &["op=\"consume\"", "outcome=\"used\""]
        ) >= 1.0,
        "{text}"
    );
    assert!(
        sample(
            &text,
            "idem_token_ops_total",
            &["op=\"consume\"", "outcome=\"invalid\""]
        ) >= 1.0,
        "{text}"
    );
    assert!(!text.contains("checkout-1"), "no key in the metrics");

    // The sweeper's deletions are counted too.
    let expired: Result<u8, idem::IdemError> = idem::Call::new("SWEEP", "k")
        .ttl(std::time::Duration::from_millis(30))
        .lease(std::time::Duration::from_millis(10))
        .run(&store, async { Ok(1) })
        .await;
    expired.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(60)).await;
    assert!(
        idem::Sweeper::new(store.clone(), 100)
            .sweep_once()
            .await
            .unwrap()
            >= 1
    );
    let text = scrape(&url).await;
    assert!(
        sample(
            &text,
            "idem_sweeper_deleted_total",
            &["store=\"sqlite\"", "kind=\"records\""]
        ) >= 1.0,
        "{text}"
    );
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shop_answers_the_same_session_on_mariadb() {
    let url = server::mysql_url();
    let Some(store) = server::reach("MariaDB", &url, idem::MySqlStore::connect(&url)).await else {
        return;
    };
    store.migrate().await.unwrap();
    let _turn = ONE_SHOP.lock().await;
    let db = shop::Db::MySql(store.clone());
    let app = shop::app(
        Arc::new(store.clone()),
        db,
        Arc::new(store.tokens()),
        metrics(),
    )
    .await
    .unwrap();
    script(serve(app).await).await;
}
