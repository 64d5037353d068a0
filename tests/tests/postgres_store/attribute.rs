//! `#[idempotent]` on Postgres: the store by name, and in the caller's transaction.

use super::*;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Paid {
    order_no: String,
    row: i64,
}

#[derive(Debug, thiserror::Error)]
enum ShopError {
    #[error(transparent)]
    Idem(#[from] IdemError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

static RUNS: AtomicU32 = AtomicU32::new(0);

// By name: the store registered as "postgres" at start-up.
#[idem::idempotent(
    biz = "PG_MACRO",
    key = "order_no",
    store = "postgres",
    fingerprint = "amount"
)]
async fn pay_by_name(order_no: &str, amount: u64) -> Result<Paid, ShopError> {
    let row = i64::from(RUNS.fetch_add(1, Ordering::Relaxed));
    let _ = amount;
    Ok(Paid {
        order_no: order_no.to_owned(),
        row,
    })
}

// In the caller's transaction: the claim, the business row and the mark commit together.
#[idem::idempotent(biz = "PG_MACRO_TX", key = "order_no", tx = "tx")]
async fn pay_in_tx(tx: &mut PgTx, order_no: &str, table: &str) -> Result<Paid, ShopError> {
    let row: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "INSERT INTO {table} (order_no) VALUES ($1) RETURNING id"
    )))
    .bind(order_no)
    .fetch_one(&mut **tx)
    .await?;
    Ok(Paid {
        order_no: order_no.to_owned(),
        row,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_works_by_name_and_in_transactions() {
    let Some(store) = pg::store(4).await else {
        return;
    };
    idem::register_store("postgres", store.clone());
    let order = contract::biz("ORD");
    let first = pay_by_name(&order, 990).await.unwrap();
    let (again, report) = idem::metrics::observe(pay_by_name(&order, 990)).await;
    assert_eq!(again.unwrap(), first);
    assert!(report.unwrap().replayed());
    assert!(matches!(
        pay_by_name(&order, 991).await,
        Err(ShopError::Idem(IdemError::PayloadMismatch))
    ));

    let payments = format!("{}_pay", store.table());
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {payments} (id BIGSERIAL PRIMARY KEY, order_no TEXT NOT NULL)"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    let mut tx = store.begin().await.unwrap();
    let first = pay_in_tx(&mut tx, &order, &payments).await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.begin().await.unwrap();
    assert_eq!(pay_in_tx(&mut tx, &order, &payments).await.unwrap(), first);
    tx.commit().await.unwrap();
    // A rolled-back transaction leaves neither the claim nor the payment.
    let other = contract::biz("ORD");
    let mut tx = store.begin().await.unwrap();
    pay_in_tx(&mut tx, &other, &payments).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(store.load("PG_MACRO_TX", &other).await.unwrap().is_none());
    let rows: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) FROM {payments}")))
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(rows, 1, "one payment row in all");
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE {payments}")))
        .execute(store.pool())
        .await
        .unwrap();
    pg::drop_tables(&store).await;
}
