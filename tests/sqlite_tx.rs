//! Transaction mode on SQLite: the claim, the business writes and the mark commit or roll back
//! together, in the caller's transaction.

use std::sync::Arc;

use idem::sqlx::{self, Sqlite, SqlitePool, Transaction};
use idem::{IdemError, SqliteStore, Status, Store, idempotent};
use serde::{Deserialize, Serialize};
use tokio::sync::OnceCell;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PayReq {
    order_no: String,
    amount: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order_no: String,
    row: i64,
}

#[derive(Debug, thiserror::Error)]
enum PayError {
    #[error("declined after writing")]
    Declined,
    #[error(transparent)]
    Idem(#[from] IdemError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

static STORE: OnceCell<Arc<SqliteStore>> = OnceCell::const_new();

/// One file database per test binary, registered as `tx_sqlite`, with an `orders` table
/// (no unique constraint: only idem keeps it free of duplicates).
async fn store() -> &'static Arc<SqliteStore> {
    STORE
        .get_or_init(|| async {
            let path = std::env::temp_dir().join(format!("idem-tx-{}.db", std::process::id()));
            let _ = std::fs::remove_file(&path);
            let store = Arc::new(SqliteStore::open(&path).await.unwrap());
            store.migrate().await.unwrap();
            sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, order_no TEXT NOT NULL, amount INTEGER NOT NULL)")
                .execute(store.pool())
                .await
                .unwrap();
            idem::register_store("tx_sqlite", store.clone());
            idem::register_store("not_sqlite", idem::MemoryStore::new());
            store
        })
        .await
}

async fn begin(pool: &SqlitePool) -> Transaction<'static, Sqlite> {
    SqliteStore::from_pool(pool.clone()).begin().await.unwrap()
}

async fn orders(pool: &SqlitePool, order_no: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE order_no = ?1")
        .bind(order_no)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[idempotent(
    biz = "TXPAY",
    key = "req.order_no",
    store = "tx_sqlite",
    tx = "tx",
    fingerprint = "req"
)]
async fn pay(
    tx: &mut Transaction<'_, Sqlite>,
    req: &PayReq,
    decline: bool,
) -> Result<Receipt, PayError> {
    let row = sqlx::query("INSERT INTO orders (order_no, amount) VALUES (?1, ?2)")
        .bind(&req.order_no)
        .bind(req.amount)
        .execute(&mut **tx)
        .await?
        .last_insert_rowid();
    if decline {
        return Err(PayError::Declined);
    }
    Ok(Receipt {
        order_no: req.order_no.clone(),
        row,
    })
}

#[idempotent(biz = "TXPAY", key = "req.order_no", store = "not_sqlite", tx = "tx")]
async fn pay_on_wrong_store(
    tx: &mut Transaction<'_, Sqlite>,
    req: &PayReq,
) -> Result<Receipt, PayError> {
    let _ = tx;
    Ok(Receipt {
        order_no: req.order_no.clone(),
        row: 0,
    })
}

fn req(order_no: &str) -> PayReq {
    PayReq {
        order_no: order_no.to_owned(),
        amount: 100,
    }
}

#[tokio::test]
async fn commit_keeps_claim_business_and_mark_together() {
    let store = store().await;
    let pool = store.pool();
    let mut tx = begin(pool).await;
    let first = pay(&mut tx, &req("T-1"), false).await.unwrap();
    tx.commit().await.unwrap();
    let rec = store.load("TXPAY", "T-1").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.attempt), (Status::Succeeded, 1));

    let mut tx = begin(pool).await;
    let (again, report) = idem::observe(pay(&mut tx, &req("T-1"), false)).await;
    tx.commit().await.unwrap();
    assert_eq!(again.unwrap(), first);
    assert!(report.unwrap().replayed());
    assert_eq!(orders(pool, "T-1").await, 1);
}

#[tokio::test]
async fn body_error_rolls_back_the_claim_and_the_business_writes() {
    let store = store().await;
    let pool = store.pool();
    let mut tx = begin(pool).await;
    let res = pay(&mut tx, &req("T-2"), true).await;
    assert!(matches!(res, Err(PayError::Declined)), "{res:?}");
    // Even if the caller commits after the error, neither the claim nor the order row survive.
    tx.commit().await.unwrap();
    assert!(store.load("TXPAY", "T-2").await.unwrap().is_none());
    assert_eq!(orders(pool, "T-2").await, 0);

    let mut tx = begin(pool).await;
    pay(&mut tx, &req("T-2"), false).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(orders(pool, "T-2").await, 1);
    assert_eq!(
        store.load("TXPAY", "T-2").await.unwrap().unwrap().attempt,
        1
    );
}

#[tokio::test]
async fn caller_rollback_after_success_leaves_nothing_and_a_retry_runs() {
    let store = store().await;
    let pool = store.pool();
    let mut tx = begin(pool).await;
    pay(&mut tx, &req("T-3"), false).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(
        store.load("TXPAY", "T-3").await.unwrap().is_none(),
        "the claim must roll back with the business"
    );
    assert_eq!(orders(pool, "T-3").await, 0);

    let mut tx = begin(pool).await;
    pay(&mut tx, &req("T-3"), false).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(orders(pool, "T-3").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_in_transactions_execute_once() {
    let store = store().await;
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (pool, barrier) = (store.pool().clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let mut tx = begin(&pool).await;
                let receipt = pay(&mut tx, &req("T-4"), false).await.unwrap();
                tx.commit().await.unwrap();
                receipt
            })
        })
        .collect();
    let mut receipts = Vec::new();
    for t in tasks {
        receipts.push(t.await.unwrap());
    }
    assert!(
        receipts.windows(2).all(|w| w[0] == w[1]),
        "every duplicate gets the first answer"
    );
    assert_eq!(orders(store.pool(), "T-4").await, 1);
}

#[tokio::test]
async fn payload_mismatch_in_a_transaction_writes_nothing() {
    let store = store().await;
    let pool = store.pool();
    let mut tx = begin(pool).await;
    pay(&mut tx, &req("T-5"), false).await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = begin(pool).await;
    let other = PayReq {
        amount: 999,
        ..req("T-5")
    };
    let res = pay(&mut tx, &other, false).await;
    tx.commit().await.unwrap();
    assert!(
        matches!(res, Err(PayError::Idem(IdemError::PayloadMismatch))),
        "{res:?}"
    );
    assert_eq!(orders(pool, "T-5").await, 1);
}

#[tokio::test]
async fn a_store_of_another_backend_cannot_join_the_transaction() {
    let store = store().await;
    let pool = store.pool();
    let mut tx = begin(pool).await;
    let res = pay_on_wrong_store(&mut tx, &req("T-6")).await;
    tx.commit().await.unwrap();
    assert!(
        matches!(res, Err(PayError::Idem(IdemError::TxStoreMismatch { .. }))),
        "{res:?}"
    );
    assert!(store.load("TXPAY", "T-6").await.unwrap().is_none());
}
