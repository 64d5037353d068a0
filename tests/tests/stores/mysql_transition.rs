//! `#[state_transition]` on MySQL / MariaDB (`IDEM_MYSQL_URL`): a table and a column named by
//! reserved words (quoted with backticks), repeats, refusals, missing rows, version conflicts,
//! body errors, a transaction of its own on a registered store, 64 concurrent deliveries applied
//! once, and the READ COMMITTED rule: a row that moved into a `from` state between the update and
//! the read that classifies it is updated again, not reported as a refusal.

use std::sync::Arc;

use crate::contract::server;
use async_trait::async_trait;
use idem::sqlx::{self, MySqlPool};
use idem::state_machine::{Dialect, SqlValue, StateRow, TransitionConn};
use idem::{IdemError, MySqlStore, MySqlTx, StateMachine, Transition, state_transition};

#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(table = "order", key = "key", status = "status", version = "version")]
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

impl idem::RestartsTransaction for OrderError {
    fn restarts_transaction(&self) -> bool {
        matches!(self, OrderError::Idem(e) if e.restarts_transaction())
    }
}

/// A store on a database of its own (the machine's table names are fixed), with the tables made.
async fn setup(name: &str) -> Option<Arc<MySqlStore>> {
    let url = server::mysql_url();
    let admin = server::reach(
        "MySQL",
        &url,
        MySqlStore::connect_with(&url, 2, std::time::Duration::from_secs(2)),
    )
    .await?;
    let db = server::unique(&format!("idem_st_{name}"));
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{db}`")))
        .execute(admin.pool())
        .await
        .unwrap();
    let (base, _) = url.rsplit_once('/').unwrap();
    let store = MySqlStore::connect_with(
        &format!("{base}/{db}"),
        70,
        std::time::Duration::from_secs(5),
    )
    .await
    .unwrap();
    store.migrate().await.unwrap();
    for ddl in [
        "CREATE TABLE `order` (`key` VARCHAR(64) PRIMARY KEY, status VARCHAR(32) NOT NULL, \
         trade_no VARCHAR(64), paid_at DATETIME, version BIGINT NOT NULL DEFAULT 0) ENGINE = InnoDB",
        "CREATE TABLE coupons (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_no VARCHAR(64) NOT NULL) \
         ENGINE = InnoDB",
    ] {
        sqlx::query(ddl).execute(store.pool()).await.unwrap();
    }
    Some(Arc::new(store))
}

async fn insert(pool: &MySqlPool, key: &str, status: OrderStatus) {
    sqlx::query("INSERT INTO `order` (`key`, status) VALUES (?, ?)")
        .bind(key)
        .bind(status)
        .execute(pool)
        .await
        .unwrap();
}

async fn status(pool: &MySqlPool, key: &str) -> OrderStatus {
    sqlx::query_scalar("SELECT status FROM `order` WHERE `key` = ?")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn coupons(pool: &MySqlPool, key: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM coupons WHERE order_no = ?")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

// The short form on the store's transaction: the first other parameter is the key column.
#[state_transition(from = "WAIT_PAY", to = "PAID")]
async fn pay(tx: &mut MySqlTx, key: &str) -> Result<Transition<u64, OrderStatus>, OrderError> {
    sqlx::query("INSERT INTO coupons (order_no) VALUES (?)")
        .bind(key)
        .execute(&mut **tx)
        .await?;
    Ok(7)
}

// A payment callback: `from` list, `set`, `now`, `match` (the same trade_no is a repeat).
#[state_transition(
    from = ["WAIT_PAY", "PAY_FAILED"],
    to = "PAID",
    set(trade_no = "trade_no"),
    now = "paid_at",
    match(trade_no),
)]
async fn on_paid(
    tx: &mut MySqlTx,
    key: &str,
    trade_no: &str,
) -> Result<Transition<(), OrderStatus>, OrderError> {
    sqlx::query("INSERT INTO coupons (order_no) VALUES (?)")
        .bind(key)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

// A body that fails after writing: the transition and its writes roll back. On any connection.
#[state_transition(from = "WAIT_PAY", to = "CLOSED")]
async fn close_but_refuse<C: TransitionConn>(
    tx: &mut C,
    key: &str,
) -> Result<Transition<(), OrderStatus>, OrderError> {
    tx.execute(
        "INSERT INTO coupons (order_no) VALUES (?)",
        &[SqlValue::Text(key.into())],
    )
    .await?;
    Err(OrderError::Refused)
}

// Optimistic lock, in a transaction of its own on the store registered as "mysql".
#[state_transition(
    machine = OrderStatus,
    from = "PAID",
    to = "REFUND_PENDING",
    store = "mysql",
    version = "seen_version"
)]
async fn request_refund(
    key: &str,
    seen_version: i64,
) -> Result<Transition<&'static str, OrderStatus>, OrderError> {
    Ok("refund requested")
}

#[tokio::test(flavor = "multi_thread")]
async fn repeats_refusals_and_missing_rows_are_told_apart() {
    let Some(store) = setup("basic").await else {
        return;
    };
    let pool = store.pool();
    insert(pool, "A1", OrderStatus::WaitPay).await;
    let mut tx = store.begin().await.unwrap();
    assert_eq!(pay(&mut tx, "A1").await.unwrap(), Transition::Applied(7));
    assert_eq!(
        pay(&mut tx, "A1").await.unwrap(),
        Transition::AlreadyApplied
    );
    insert(pool, "A2", OrderStatus::Refunding).await;
    assert_eq!(
        pay(&mut tx, "A2").await.unwrap(),
        Transition::Rejected {
            current: OrderStatus::Refunding
        }
    );
    assert_eq!(pay(&mut tx, "A9").await.unwrap(), Transition::NotFound);
    tx.commit().await.unwrap();
    assert_eq!(status(pool, "A1").await, OrderStatus::Paid);
    assert_eq!(coupons(pool, "A1").await, 1);

    insert(pool, "B1", OrderStatus::PayFailed).await;
    let mut tx = store.begin().await.unwrap();
    assert!(on_paid(&mut tx, "B1", "T-1").await.unwrap().is_applied());
    assert_eq!(
        on_paid(&mut tx, "B1", "T-1").await.unwrap(),
        Transition::AlreadyApplied,
        "the same callback again"
    );
    assert_eq!(
        on_paid(&mut tx, "B1", "T-2").await.unwrap(),
        Transition::Rejected {
            current: OrderStatus::Paid
        },
        "another trade for a paid order"
    );
    tx.commit().await.unwrap();
    let paid_at: Option<String> =
        sqlx::query_scalar("SELECT CAST(paid_at AS CHAR) FROM `order` WHERE `key` = 'B1'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert!(
        paid_at.is_some(),
        "now = \"paid_at\" wrote the database's time"
    );
    assert_eq!(coupons(pool, "B1").await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_error_rolls_the_transition_back() {
    let Some(store) = setup("body_err").await else {
        return;
    };
    let pool = store.pool();
    insert(pool, "C1", OrderStatus::WaitPay).await;
    let mut tx = store.begin().await.unwrap();
    let out = close_but_refuse(&mut tx, "C1").await;
    assert!(matches!(out, Err(OrderError::Refused)), "{out:?}");
    // The caller commits anyway: neither the move nor the body's write survive.
    tx.commit().await.unwrap();
    assert_eq!(status(pool, "C1").await, OrderStatus::WaitPay);
    assert_eq!(coupons(pool, "C1").await, 0);
    // On a plain sqlx transaction too.
    let mut tx = pool.begin().await.unwrap();
    assert!(close_but_refuse(&mut tx, "C1").await.is_err());
    tx.commit().await.unwrap();
    assert_eq!(status(pool, "C1").await, OrderStatus::WaitPay);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_version_conflict_is_told_apart_on_a_registered_store() {
    let Some(store) = setup("versions").await else {
        return;
    };
    idem::register_store("mysql", store.clone());
    let pool = store.pool();
    insert(pool, "D1", OrderStatus::Paid).await;
    sqlx::query("UPDATE `order` SET version = 3 WHERE `key` = 'D1'")
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
    let version: i64 = sqlx::query_scalar("SELECT version FROM `order` WHERE `key` = 'D1'")
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_transitions_apply_once() {
    const N: usize = 64;
    let Some(store) = setup("concurrent").await else {
        return;
    };
    insert(store.pool(), "E1", OrderStatus::WaitPay).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(N));
    let mut tasks = Vec::new();
    for _ in 0..N {
        let (store, barrier) = (store.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            idem::retry_transaction(|| async {
                let mut tx = store.begin().await?;
                let out = pay(&mut tx, "E1").await?;
                tx.commit().await?;
                Ok::<_, OrderError>(out)
            })
            .await
            .unwrap()
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

// Any connection: used through a wrapper below.
#[state_transition(from = "WAIT_PAY", to = "PAID")]
async fn pay_any<C: TransitionConn>(
    tx: &mut C,
    key: &str,
) -> Result<Transition<(), OrderStatus>, OrderError> {
    tx.execute(
        "INSERT INTO coupons (order_no) VALUES (?)",
        &[SqlValue::Text(key.into())],
    )
    .await?;
    Ok(())
}

/// A connection that lets another session commit between the transition's update and the read
/// that classifies it: what READ COMMITTED allows (it releases the lock on a row the update's
/// WHERE did not match).
struct Interleaved {
    tx: sqlx::Transaction<'static, sqlx::MySql>,
    pool: MySqlPool,
    meddle: Option<&'static str>,
}

#[async_trait]
impl TransitionConn for Interleaved {
    fn dialect(&self) -> Dialect {
        Dialect::MySQL
    }

    async fn execute(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
    ) -> Result<u64, IdemError> {
        self.tx.execute(sql, args).await
    }

    async fn execute_unprepared(&mut self, sql: &str) -> Result<(), IdemError> {
        self.tx.execute_unprepared(sql).await
    }

    async fn read_state(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
        versioned: bool,
    ) -> Result<Option<StateRow>, IdemError> {
        if let Some(meddle) = self.meddle.take() {
            sqlx::query(meddle)
                .execute(&self.pool)
                .await
                .map_err(IdemError::store)?;
        }
        self.tx.read_state(sql, args, versioned).await
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_row_that_moved_into_a_from_state_after_the_update_is_updated_again() {
    let Some(store) = setup("read_committed").await else {
        return;
    };
    let pool = store.pool().clone();
    insert(&pool, "F1", OrderStatus::Closed).await;
    let tx = pool
        .begin_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; BEGIN")
        .await
        .unwrap();
    // The update finds F1 CLOSED (0 rows); then another session moves it to WAIT_PAY and commits;
    // the locking read sees WAIT_PAY, a `from` state: the transition updates once more and
    // applies, instead of reporting "rejected: current WAIT_PAY".
    let mut conn = Interleaved {
        tx,
        pool: pool.clone(),
        meddle: Some("UPDATE `order` SET status = 'WAIT_PAY' WHERE `key` = 'F1'"),
    };
    let out = pay_any(&mut conn, "F1").await.unwrap();
    assert!(
        conn.meddle.is_none(),
        "the other session committed in between"
    );
    conn.tx.commit().await.unwrap();
    assert_eq!(out, Transition::Applied(()));
    assert_eq!(status(&pool, "F1").await, OrderStatus::Paid);
    assert_eq!(coupons(&pool, "F1").await, 1);
}
