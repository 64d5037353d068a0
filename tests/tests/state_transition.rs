//! `#[derive(StateMachine)]` + `#[state_transition]` on SQLite, through the public API: the conditional
//! update moves a row once; repeats, refusals, missing rows, version conflicts and body errors are told
//! apart; 64 concurrent deliveries of one transition apply it exactly once.

use std::sync::Arc;

use idem::SqliteTx;
use idem::sqlx::{self, Sqlite, SqlitePool, Transaction};
use idem::{IdemError, SqliteStore, StateMachine, Transition, state_transition};

#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(
    table = "orders",
    key = "order_no",
    status = "status",
    version = "version"
)]
enum OrderStatus {
    #[state(to(Paid, Closed))]
    WaitPay,
    #[state(to(Paid, Closed))]
    PayFailed,
    #[state(to(Refunding))]
    Paid,
    #[state(name = "REFUND_PENDING", to(Refunded))]
    Refunding,
    #[state(terminal)]
    Refunded,
    #[state(terminal)]
    Closed,
}

#[derive(Debug, thiserror::Error)]
enum OrderError {
    #[error("the body refused")]
    Refused,
    #[error(transparent)]
    Idem(#[from] IdemError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// A fresh file database with an `orders` table and a `coupons` table (no unique index: only the
/// transition keeps coupons single).
async fn setup(name: &str) -> Arc<SqliteStore> {
    let path = std::env::temp_dir().join(format!("idem-st-{name}-{}.db", std::process::id()));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    sqlx::query(
        "CREATE TABLE orders (order_no TEXT PRIMARY KEY, status TEXT NOT NULL, trade_no TEXT, \
         paid_at TEXT, amount INTEGER NOT NULL DEFAULT 100, version INTEGER NOT NULL DEFAULT 0)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    sqlx::query("CREATE TABLE coupons (order_no TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    store
}

async fn insert(pool: &SqlitePool, order_no: &str, status: OrderStatus) {
    sqlx::query("INSERT INTO orders (order_no, status) VALUES (?, ?)")
        .bind(order_no)
        .bind(status)
        .execute(pool)
        .await
        .unwrap();
}

async fn status(pool: &SqlitePool, order_no: &str) -> OrderStatus {
    sqlx::query_scalar("SELECT status FROM orders WHERE order_no = ?")
        .bind(order_no)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn coupons(pool: &SqlitePool, order_no: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM coupons WHERE order_no = ?")
        .bind(order_no)
        .fetch_one(pool)
        .await
        .unwrap()
}

// The short form: `tx` is the caller's transaction, the first other parameter is the key column.
#[state_transition(from = "WAIT_PAY", to = "PAID")]
async fn pay(
    tx: &mut SqliteTx,
    order_no: &str,
) -> Result<Transition<u64, OrderStatus>, OrderError> {
    sqlx::query("INSERT INTO coupons (order_no) VALUES (?)")
        .bind(order_no)
        .execute(&mut **tx)
        .await?;
    Ok(7)
}

// A payment callback: `from` list, `set`, `now`, `match` (the same trade_no is a repeat).
#[state_transition(
    from = ["WAIT_PAY", "PAY_FAILED"],
    to = "PAID",
    key = "callback.order_no",
    set(trade_no = "callback.trade_no"),
    now = "paid_at",
    match(trade_no),
)]
async fn on_paid(
    tx: &mut SqliteTx,
    callback: &Callback,
) -> Result<Transition<(), OrderStatus>, OrderError> {
    sqlx::query("INSERT INTO coupons (order_no) VALUES (?)")
        .bind(&callback.order_no)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

struct Callback {
    order_no: String,
    trade_no: String,
}

// A body that fails after writing: the transition and its writes roll back.
#[state_transition(from = "WAIT_PAY", to = "CLOSED", tx = "conn", key = "id")]
async fn close_but_refuse(
    id: &str,
    conn: &mut Transaction<'_, Sqlite>,
) -> Result<Transition<(), OrderStatus>, OrderError> {
    sqlx::query("INSERT INTO coupons (order_no) VALUES (?)")
        .bind(id)
        .execute(&mut **conn)
        .await?;
    Err(OrderError::Refused)
}

// Optimistic lock, in a transaction of its own on a registered store.
#[state_transition(
    machine = OrderStatus,
    from = "PAID",
    to = "REFUND_PENDING",
    store = "st_versions",
    version = "seen_version"
)]
async fn request_refund(
    order_no: &str,
    seen_version: i64,
) -> Result<Transition<&'static str, OrderStatus>, OrderError> {
    Ok("refund requested")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_short_form_applies_once() {
    let store = setup("short").await;
    let pool = store.pool();
    insert(pool, "A1", OrderStatus::WaitPay).await;
    let mut tx = store.begin().await.unwrap();
    let first = pay(&mut tx, "A1").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(first, Transition::Applied(7));
    let mut tx = store.begin().await.unwrap();
    let second = pay(&mut tx, "A1").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(second, Transition::AlreadyApplied);
    assert_eq!(status(pool, "A1").await, OrderStatus::Paid);
    assert_eq!(coupons(pool, "A1").await, 1);

    let mut tx = store.begin().await.unwrap();
    assert_eq!(pay(&mut tx, "missing").await.unwrap(), Transition::NotFound);
    tx.commit().await.unwrap();
}

/// Transitions are reported like every other call: `observe` sees the outcome, and the counters
/// count it under the machine's name.
#[tokio::test(flavor = "multi_thread")]
async fn every_transition_is_observed_and_counted() {
    use idem::metrics::Outcome;
    let store = setup("observed").await;
    let pool = store.pool();
    insert(pool, "O1", OrderStatus::WaitPay).await;
    let before = idem::metrics::counts_for("OrderStatus");
    let mut outcomes = Vec::new();
    for key in ["O1", "O1", "nope"] {
        let mut tx = store.begin().await.unwrap();
        let (res, report) = idem::metrics::observe(pay(&mut tx, key)).await;
        tx.commit().await.unwrap();
        let _ = res.unwrap();
        let report = report.expect("a transition reports");
        assert_eq!(report.biz, "OrderStatus");
        outcomes.push(report.outcome);
    }
    assert_eq!(
        outcomes,
        [Outcome::Executed, Outcome::Replayed, Outcome::NotFound]
    );
    let counted = idem::metrics::counts_for("OrderStatus").since(&before);
    // Other tests of this binary run transitions of the same machine concurrently: at least ours.
    assert!(
        counted.get(Outcome::Executed) >= 1 && counted.get(Outcome::NotFound) >= 1,
        "{counted:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn from_lists_set_now_and_match() {
    let store = setup("callback").await;
    let pool = store.pool();
    insert(pool, "B1", OrderStatus::PayFailed).await;
    insert(pool, "B2", OrderStatus::Closed).await;
    let paid = |order_no: &str, trade_no: &str| Callback {
        order_no: order_no.to_owned(),
        trade_no: trade_no.to_owned(),
    };

    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        on_paid(&mut tx, &paid("B1", "T1")).await.unwrap(),
        Transition::Applied(())
    );
    // Same callback again: a repeat. Another trade_no: not the same payment, refused.
    assert_eq!(
        on_paid(&mut tx, &paid("B1", "T1")).await.unwrap(),
        Transition::AlreadyApplied
    );
    assert_eq!(
        on_paid(&mut tx, &paid("B1", "T2")).await.unwrap(),
        Transition::Rejected {
            current: OrderStatus::Paid
        }
    );
    assert_eq!(
        on_paid(&mut tx, &paid("B2", "T3")).await.unwrap(),
        Transition::Rejected {
            current: OrderStatus::Closed
        }
    );
    assert_eq!(
        on_paid(&mut tx, &paid("B9", "T4")).await.unwrap(),
        Transition::NotFound
    );
    tx.commit().await.unwrap();

    let (trade_no, paid_at): (String, Option<String>) =
        sqlx::query_as("SELECT trade_no, paid_at FROM orders WHERE order_no = 'B1'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(trade_no, "T1");
    assert!(paid_at.is_some(), "`now` set the timestamp");
    assert_eq!(coupons(pool, "B1").await, 1);
    assert_eq!(coupons(pool, "B2").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_error_rolls_the_transition_back() {
    let store = setup("rollback").await;
    let pool = store.pool();
    insert(pool, "C1", OrderStatus::WaitPay).await;
    // A transaction of `idem::sqlx` begun on the pool works too (not only `store.begin()`'s).
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let out = close_but_refuse("C1", &mut tx).await;
    assert!(matches!(out, Err(OrderError::Refused)), "{out:?}");
    // The caller's transaction is still usable and commits nothing of the failed transition.
    tx.commit().await.unwrap();
    assert_eq!(status(pool, "C1").await, OrderStatus::WaitPay);
    assert_eq!(coupons(pool, "C1").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_version_conflict_is_told_apart() {
    let store = setup("versions").await;
    idem::register_store("st_versions", store.clone());
    let pool = store.pool();
    insert(pool, "D1", OrderStatus::Paid).await;
    sqlx::query("UPDATE orders SET version = 3 WHERE order_no = 'D1'")
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(
        request_refund("D1", 2).await.unwrap(),
        Transition::VersionConflict {
            current: OrderStatus::Paid,
            version: 3
        }
    );
    assert_eq!(
        request_refund("D1", 3).await.unwrap(),
        Transition::Applied("refund requested")
    );
    assert_eq!(status(pool, "D1").await, OrderStatus::Refunding);
    let version: i64 = sqlx::query_scalar("SELECT version FROM orders WHERE order_no = 'D1'")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(version, 4, "the version was bumped");
    assert_eq!(
        request_refund("D1", 4).await.unwrap(),
        Transition::AlreadyApplied
    );
    assert_eq!(request_refund("D9", 0).await.unwrap(), Transition::NotFound);
}

#[tokio::test(flavor = "multi_thread")]
async fn sixty_four_concurrent_transitions_apply_once() {
    const N: usize = 64;
    let store = setup("concurrent").await;
    insert(store.pool(), "E1", OrderStatus::WaitPay).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(N));
    let mut tasks = Vec::new();
    for _ in 0..N {
        let (store, barrier) = (store.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut tx = store.begin().await.unwrap();
            let out = pay(&mut tx, "E1").await.unwrap();
            tx.commit().await.unwrap();
            out
        }));
    }
    let mut applied = 0;
    for task in tasks {
        match task.await.unwrap() {
            Transition::Applied(_) => applied += 1,
            Transition::AlreadyApplied => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(applied, 1);
    assert_eq!(status(store.pool(), "E1").await, OrderStatus::Paid);
    assert_eq!(coupons(store.pool(), "E1").await, 1, "the body ran once");
}

#[test]
fn the_machine_and_its_sql_are_readable() {
    assert_eq!(OrderStatus::WaitPay.to_string(), "WAIT_PAY");
    assert_eq!(
        "REFUND_PENDING".parse::<OrderStatus>().unwrap(),
        OrderStatus::Refunding
    );
    assert!("NOPE".parse::<OrderStatus>().is_err());
    assert!(OrderStatus::WaitPay.can_move_to(OrderStatus::Paid));
    assert!(OrderStatus::Refunded.is_terminal());
    assert_eq!(OrderStatus::TABLE, "orders");
    // The exact SQL of a transition, per dialect, through public API (what the fn's docs show).
    let sql = idem::state_machine::TransitionSql::build::<OrderStatus>(
        &idem::state_machine::TransitionShape {
            set: &["trade_no"],
            now: Some("paid_at"),
            matches: &["trade_no"],
            from_count: 2,
            versioned: false,
        },
    );
    assert_eq!(
        sql.postgres.update.as_str(),
        "UPDATE \"orders\" SET \"status\" = $1, \"trade_no\" = $2, \"paid_at\" = CURRENT_TIMESTAMP, \
         \"version\" = \"version\" + 1 WHERE \"order_no\" = $3 AND \"status\" IN ($4, $5)"
    );
    assert_eq!(
        sql.mysql.read.as_str(),
        "SELECT `status`, CASE WHEN `status` = ? AND `trade_no` = ? THEN 1 ELSE 0 END, `version` \
         FROM `orders` WHERE `order_no` = ? FOR UPDATE"
    );
}
