//! What the Idempotency-Key layer costs a request: an axum router called in process (no sockets, so
//! the figure is the layer's own work, not the network's), a bare handler against the same handler
//! behind the layer on a `MemoryStore`, first executions (a new key each) and replays (one key).
//! Rounds alternate the order and the ratio is taken per round, then the median.
//!
//! Transaction mode on an in-memory SQLite store: a bare handler that inserts its order in a
//! transaction of its own (begin, insert, commit) against the same insert behind the layer in
//! transaction mode (begin, claim, insert, mark, commit), first executions and replays.
//!
//! `cargo bench -p idem-suite --bench http --features axum`

use std::hint::black_box;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderName, Request};
use axum::routing::post;
use idem::http::{IdempotencyLayer, LayerTx, Principal};
use idem::sqlx::SqlitePool;
use idem::{MemoryStore, SqliteStore, SqliteTx};
use tower::ServiceExt;

mod support;
use support::{Table, median, r3, rate};

fn router(layer: Option<IdempotencyLayer>) -> Router {
    let route = post(|body: String| async move {
        axum::Json(serde_json::json!({ "order_id": 7, "echo": body.len() }))
    });
    let route = match layer {
        Some(layer) => route.layer(layer),
        None => route,
    };
    Router::new().route("/orders", route)
}

const INSERT: &str = "INSERT INTO orders (item) VALUES ('book')";

/// `POST /orders` inserting an order: in a transaction of its own (bare), or in the layer's.
fn tx_router(store: &SqliteStore, layer: bool) -> Router {
    if layer {
        let route = post(|mut tx: LayerTx<SqliteTx>| async move {
            idem::sqlx::query(INSERT).execute(tx.conn()).await.unwrap();
            axum::Json(serde_json::json!({ "order_id": 7 }))
        });
        let layer = IdempotencyLayer::builder_tx(store.clone())
            .principal(Principal::header(HeaderName::from_static("x-user")))
            .ttl(Duration::from_secs(3600))
            .build()
            .unwrap();
        Router::new().route("/orders", route.layer(layer))
    } else {
        let route = post(|State(pool): State<SqlitePool>| async move {
            let mut tx = pool.begin().await.unwrap();
            idem::sqlx::query(INSERT).execute(&mut *tx).await.unwrap();
            tx.commit().await.unwrap();
            axum::Json(serde_json::json!({ "order_id": 7 }))
        });
        Router::new()
            .route("/orders", route)
            .with_state(store.pool().clone())
    }
}

fn request(key: &str) -> Request<Body> {
    Request::post("/orders")
        .header("x-user", "alice")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(r#"{"item":"book","amount":1200}"#))
        .unwrap()
}

async fn run(app: &Router, n: u64, key: impl Fn(u64) -> String) -> f64 {
    let t = Instant::now();
    for i in 0..n {
        let response = app.clone().oneshot(request(&key(i))).await.unwrap();
        assert!(response.status().is_success());
        black_box(
            axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .unwrap(),
        );
    }
    n as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // IDEM_BENCH_SCALE=0.1 for a quick look (or under valgrind).
    let scale = support::scale();
    let n = ((20_000.0 * scale) as u64).max(100);
    let rounds = support::rounds(if scale < 1.0 { 1 } else { 9 });
    rt.block_on(async {
        let layer = || {
            IdempotencyLayer::builder(MemoryStore::new())
                .principal(Principal::header(HeaderName::from_static("x-user")))
                .ttl(Duration::from_secs(3600))
                .build()
                .unwrap()
        };
        let bare = router(None);
        let (mut b, mut f, mut r, mut first_ratio, mut replay_ratio) =
            (vec![], vec![], vec![], vec![], vec![]);
        for round in 0..rounds {
            let fresh = router(Some(layer()));
            let replays = router(Some(layer()));
            run(&replays, 1, |_| "same".to_owned()).await;
            let (bare_rate, first_rate, replay_rate) = if round % 2 == 0 {
                let x = run(&bare, n, |_| "k".to_owned()).await;
                let y = run(&fresh, n, |i| format!("k-{round}-{i}")).await;
                let z = run(&replays, n, |_| "same".to_owned()).await;
                (x, y, z)
            } else {
                let z = run(&replays, n, |_| "same".to_owned()).await;
                let y = run(&fresh, n, |i| format!("k-{round}-{i}")).await;
                let x = run(&bare, n, |_| "k".to_owned()).await;
                (x, y, z)
            };
            b.push(bare_rate);
            f.push(first_rate);
            r.push(replay_rate);
            first_ratio.push(first_rate / bare_rate);
            replay_ratio.push(replay_rate / bare_rate);
        }
        let us = |rate: f64| 1e6 / rate;
        let (bare, first, replay) = (median(b), median(f), median(r));
        println!(
            "idem HTTP layer (one core, in-process router, median of {rounds} rounds of {n})\n"
        );
        let mut table = Table::new(
            "http",
            &["scenario", "requests/s", "µs added", "layer / bare"],
        );
        table.row([
            "bare axum handler".to_owned(),
            rate(bare),
            "–".to_owned(),
            "–".to_owned(),
        ]);
        table.row([
            "lease mode (memory): first execution (new key)".to_owned(),
            rate(first),
            format!("{:.2}", us(first) - us(bare)),
            r3(median(first_ratio)),
        ]);
        table.row([
            "lease mode (memory): replay (same key)".to_owned(),
            rate(replay),
            format!("{:.2}", us(replay) - us(bare)),
            r3(median(replay_ratio)),
        ]);

        // Transaction mode on an in-memory SQLite store (`IDEM_BENCH_ONLY=lease` skips it).
        if support::only() == ["lease"] {
            table.emit();
            return;
        }
        let store = SqliteStore::in_memory().await.unwrap();
        store.migrate().await.unwrap();
        idem::sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)")
            .execute(store.pool())
            .await
            .unwrap();
        let n = (n / 4).max(100);
        let (bare_tx, layer_tx) = (tx_router(&store, false), tx_router(&store, true));
        run(&layer_tx, 1, |_| "same".to_owned()).await;
        let (mut b, mut f, mut r) = (vec![], vec![], vec![]);
        for round in 0..rounds {
            let x = run(&bare_tx, n, |_| "k".to_owned()).await;
            let y = run(&layer_tx, n, |i| format!("t-{round}-{i}")).await;
            let z = run(&layer_tx, n, |_| "same".to_owned()).await;
            b.push(x);
            f.push(y);
            r.push(z);
        }
        let (bare, first, replay) = (median(b), median(f), median(r));
        let ratio = |x: f64| r3(x / bare);
        table.row([
            "bare handler, SQLite in memory: begin, insert, commit".to_owned(),
            rate(bare),
            "–".to_owned(),
            "–".to_owned(),
        ]);
        table.row([
            "transaction mode (SQLite in memory): first execution".to_owned(),
            rate(first),
            format!("{:.2}", us(first) - us(bare)),
            ratio(first),
        ]);
        table.row([
            "transaction mode (SQLite in memory): replay".to_owned(),
            rate(replay),
            format!("{:.2}", us(replay) - us(bare)),
            ratio(replay),
        ]);
        table.emit();
    });
}
