//! `#[state_transition]` on Postgres (`$n` placeholders, `"…"` identifiers, `FOR UPDATE` reads),
//! a gateway's callback storm replayed on it, and the READ COMMITTED case where the read that classifies
//! an update that moved nothing sees a newer row than the update did. Each test in a schema of its
//! own (`search_path`), so the machines' fixed table names do not collide.

use crate::pg;
#[allow(dead_code)] // the SQLite backend of the scenario
use crate::scenario;

use std::sync::Arc;

use async_trait::async_trait;
use idem::sqlx::postgres::PgPool;
use idem::sqlx::{self, Postgres, Transaction};
use idem::state_machine::{Dialect, SqlValue, StateRow, TransitionConn};
use idem::{IdemError, PgStore, PgTx, StateMachine, Transition, state_transition};
use scenario::{Backend, PayStatus, ScenarioError, Tables};

/// A machine on a table named with a reserved word (`order`) and a key column named `key`: only
/// quoted identifiers make it work. The version column is an `INTEGER` (read back as `i64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(table = "order", key = "key", status = "status", version = "version")]
enum Order {
    #[state(to(Paid, Closed))]
    WaitPay,
    #[state(to(Paid, Closed))]
    PayFailed,
    #[state(to(Refunding, Closed))]
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

/// A schema with the `order` and `coupons` tables; its store (records in the same schema).
async fn setup() -> Option<(PgStore, String)> {
    let (pool, schema) = pg::schema_pool(40).await?;
    for ddl in [
        "CREATE TABLE \"order\" (\"key\" TEXT PRIMARY KEY, status TEXT NOT NULL, trade_no TEXT, \
         paid_at TIMESTAMPTZ, note TEXT, version INTEGER NOT NULL DEFAULT 0)",
        "CREATE TABLE coupons (\"key\" TEXT NOT NULL)",
    ] {
        sqlx::query(ddl).execute(&pool).await.unwrap();
    }
    let store = PgStore::from_pool(pool);
    store.migrate().await.unwrap();
    Some((store, schema))
}

async fn insert(pool: &PgPool, key: &str, status: Order) {
    sqlx::query("INSERT INTO \"order\" (\"key\", status) VALUES ($1, $2)")
        .bind(key)
        .bind(status)
        .execute(pool)
        .await
        .unwrap();
}

async fn status(pool: &PgPool, key: &str) -> Order {
    sqlx::query_scalar("SELECT status FROM \"order\" WHERE \"key\" = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn coupons(pool: &PgPool, key: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM coupons WHERE \"key\" = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn coupon<C: TransitionConn>(tx: &mut C, key: &str) -> Result<(), OrderError> {
    tx.execute(
        "INSERT INTO coupons (\"key\") VALUES ($1)",
        &[SqlValue::Text(key.into())],
    )
    .await?;
    Ok(())
}

// The payment callback: a `from` list, `set`, `now` (a TIMESTAMPTZ), `match`; generic over the
// connection so the interleaving test below can run it too.
#[state_transition(
    from = ["WAIT_PAY", "PAY_FAILED"],
    to = "PAID",
    key = "key",
    set(trade_no = "trade_no", note = "note"),
    now = "paid_at",
    match(trade_no),
)]
async fn on_paid<C: TransitionConn>(
    tx: &mut C,
    key: &str,
    trade_no: &str,
    note: Option<&str>,
) -> Result<Transition<(), Order>, OrderError> {
    coupon(tx, key).await
}

// A body that fails after writing: the move and its writes roll back.
#[state_transition(from = "WAIT_PAY", to = "CLOSED", key = "key")]
async fn close_but_refuse(tx: &mut PgTx, key: &str) -> Result<Transition<(), Order>, OrderError> {
    coupon(tx, key).await?;
    Err(OrderError::Refused)
}

// On a plain sqlx transaction of `idem::sqlx`.
#[state_transition(from = "PAID", to = "CLOSED", tx = "conn", key = "key")]
async fn close_paid(
    key: &str,
    conn: &mut Transaction<'_, Postgres>,
) -> Result<Transition<(), Order>, OrderError> {
    Ok(())
}

// Optimistic lock, in a transaction of its own on a registered store.
#[state_transition(
    machine = Order,
    from = "PAID",
    to = "REFUND_PENDING",
    store = "pg_transitions",
    version = "seen"
)]
async fn request_refund(
    key: &str,
    seen: i64,
) -> Result<Transition<&'static str, Order>, OrderError> {
    Ok("refund requested")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transitions_apply_once_and_tell_every_other_case_apart() {
    let Some((store, schema)) = setup().await else {
        return;
    };
    let pool = store.pool().clone();
    insert(&pool, "A", Order::WaitPay).await;
    insert(&pool, "B", Order::PayFailed).await;
    insert(&pool, "C", Order::Refunded).await;

    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        on_paid(&mut tx, "A", "T-1", Some("first")).await.unwrap(),
        Transition::Applied(())
    );
    // The callback again: same trade number, already applied; another trade number is refused.
    assert_eq!(
        on_paid(&mut tx, "A", "T-1", None).await.unwrap(),
        Transition::AlreadyApplied
    );
    assert_eq!(
        on_paid(&mut tx, "A", "T-2", None).await.unwrap(),
        Transition::Rejected {
            current: Order::Paid
        }
    );
    // From the second `from` state, with a NULL bound to a text column.
    assert!(
        on_paid(&mut tx, "B", "T-3", None)
            .await
            .unwrap()
            .is_applied()
    );
    assert_eq!(
        on_paid(&mut tx, "C", "T-4", None).await.unwrap(),
        Transition::Rejected {
            current: Order::Refunded
        }
    );
    assert_eq!(
        on_paid(&mut tx, "Z", "T-5", None).await.unwrap(),
        Transition::NotFound
    );
    tx.commit().await.unwrap();
    assert_eq!(
        (coupons(&pool, "A").await, coupons(&pool, "B").await),
        (1, 1)
    );
    let (trade, note, stamped, version): (String, Option<String>, bool, i32) = sqlx::query_as(
        "SELECT trade_no, note, paid_at IS NOT NULL, version FROM \"order\" WHERE \"key\" = 'A'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (trade.as_str(), note.as_deref(), stamped, version),
        ("T-1", Some("first"), true, 1)
    );

    // A failing body: nothing of the move stays, and the transaction goes on.
    insert(&pool, "D", Order::WaitPay).await;
    let mut tx = store.begin().await.unwrap();
    assert!(matches!(
        close_but_refuse(&mut tx, "D").await,
        Err(OrderError::Refused)
    ));
    assert!(
        on_paid(&mut tx, "D", "T-6", None)
            .await
            .unwrap()
            .is_applied()
    );
    tx.commit().await.unwrap();
    assert_eq!(status(&pool, "D").await, Order::Paid);
    assert_eq!(
        coupons(&pool, "D").await,
        1,
        "the refused body's coupon rolled back"
    );

    // A plain sqlx transaction.
    let mut conn = pool.begin().await.unwrap();
    assert!(close_paid("D", &mut conn).await.unwrap().is_applied());
    conn.commit().await.unwrap();
    assert_eq!(status(&pool, "D").await, Order::Closed);

    // Versions, in a transaction of its own on the registered store.
    idem::register_store("pg_transitions", store.clone());
    insert(&pool, "E", Order::Paid).await;
    sqlx::query("UPDATE \"order\" SET version = 3 WHERE \"key\" = 'E'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        request_refund("E", 2).await.unwrap(),
        Transition::VersionConflict {
            current: Order::Paid,
            version: 3
        }
    );
    assert_eq!(
        request_refund("E", 3).await.unwrap(),
        Transition::Applied("refund requested")
    );
    assert_eq!(status(&pool, "E").await, Order::Refunding);
    assert_eq!(
        request_refund("E", 4).await.unwrap(),
        Transition::AlreadyApplied
    );
    assert_eq!(request_refund("Y", 0).await.unwrap(), Transition::NotFound);
    pg::drop_schema(&pool, &schema).await;
}

/// 64 deliveries of one payment callback, each in its own transaction, released together: the row
/// moves once and one coupon is issued; the others are repeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_transitions_apply_once() {
    const N: usize = 64;
    let Some((store, schema)) = setup().await else {
        return;
    };
    let pool = store.pool().clone();
    insert(&pool, "K", Order::WaitPay).await;
    let store = Arc::new(store);
    let barrier = Arc::new(tokio::sync::Barrier::new(N));
    let tasks: Vec<_> = (0..N)
        .map(|_| {
            let (store, barrier) = (store.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let mut tx = store.begin().await.unwrap();
                let outcome = on_paid(&mut tx, "K", "T-K", None).await.unwrap();
                tx.commit().await.unwrap();
                outcome
            })
        })
        .collect();
    let mut applied = 0;
    for t in tasks {
        match t.await.unwrap() {
            Transition::Applied(()) => applied += 1,
            Transition::AlreadyApplied => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(applied, 1);
    assert_eq!(coupons(&pool, "K").await, 1);
    pg::drop_schema(&pool, &schema).await;
}

/// A connection that, right after the first update that moved nothing, lets another transaction
/// move the row into a `from` state and commit: what READ COMMITTED allows between two statements.
struct Interleave {
    tx: PgTx,
    other: PgPool,
    key: &'static str,
    updates: usize,
    moved: bool,
}

#[async_trait]
impl TransitionConn for Interleave {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    async fn execute(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
    ) -> Result<u64, IdemError> {
        let rows = TransitionConn::execute(&mut self.tx, sql, args).await?;
        if sql.starts_with("UPDATE") {
            self.updates += 1;
            if rows == 0 && !self.moved {
                self.moved = true;
                sqlx::query("UPDATE \"order\" SET status = 'WAIT_PAY' WHERE \"key\" = $1")
                    .bind(self.key)
                    .execute(&self.other)
                    .await
                    .map_err(IdemError::store)?;
            }
        }
        Ok(rows)
    }

    async fn execute_unprepared(&mut self, sql: &str) -> Result<(), IdemError> {
        TransitionConn::execute_unprepared(&mut self.tx, sql).await
    }

    async fn read_state(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
        versioned: bool,
    ) -> Result<Option<StateRow>, IdemError> {
        TransitionConn::read_state(&mut self.tx, sql, args, versioned).await
    }
}

/// The update finds the row outside `from` (REFUND_PENDING) and moves nothing; then another
/// transaction moves it to WAIT_PAY and commits; the locking read sees WAIT_PAY. Reporting
/// `Rejected { current: WaitPay }` would refuse a move that is legal now: the update runs once more
/// and applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_row_seen_by_the_read_runs_the_update_again() {
    let Some((store, schema)) = setup().await else {
        return;
    };
    let pool = store.pool().clone();
    // Not a `from` state of `on_paid`, and not its target with this trade number.
    insert(&pool, "R", Order::Refunding).await;
    let mut conn = Interleave {
        tx: store.begin().await.unwrap(),
        other: pool.clone(),
        key: "R",
        updates: 0,
        moved: false,
    };
    let outcome = on_paid(&mut conn, "R", "T-R", None).await.unwrap();
    assert_eq!(outcome, Transition::Applied(()));
    assert_eq!(conn.updates, 2, "the update ran once more");
    conn.tx.commit().await.unwrap();
    assert_eq!(status(&pool, "R").await, Order::Paid);
    assert_eq!(coupons(&pool, "R").await, 1);
    pg::drop_schema(&pool, &schema).await;
}

/// The callback storm on Postgres: the scenario's tables in a schema of their own.
struct Pg {
    store: PgStore,
}

impl Backend for Pg {
    type Tx = PgTx;

    async fn begin(&self) -> Result<PgTx, ScenarioError> {
        Ok(self.store.begin().await?)
    }

    async fn commit(tx: PgTx) -> Result<(), ScenarioError> {
        Ok(tx.commit().await?)
    }

    async fn setup(&self, orders: &[String]) -> Result<(), ScenarioError> {
        let pool = self.store.pool();
        for ddl in [
            "CREATE TABLE pay_orders (order_no TEXT PRIMARY KEY, status TEXT NOT NULL, \
             trade_no TEXT, refund_no TEXT, paid_at TIMESTAMPTZ)",
            // No unique index on coupons or the ledger: only the transitions keep them single.
            "CREATE TABLE coupons (order_no TEXT NOT NULL)",
            "CREATE TABLE ledger (order_no TEXT NOT NULL, kind TEXT NOT NULL, amount BIGINT NOT NULL)",
            "CREATE TABLE history (seq BIGSERIAL PRIMARY KEY, order_no TEXT NOT NULL, status TEXT NOT NULL)",
        ] {
            sqlx::query(ddl).execute(pool).await?;
        }
        for order in orders {
            sqlx::query("INSERT INTO pay_orders (order_no, status) VALUES ($1, $2)")
                .bind(order)
                .bind(PayStatus::WaitPay)
                .execute(pool)
                .await?;
        }
        Ok(())
    }

    async fn read_back(&self) -> Result<Tables, ScenarioError> {
        let pool = self.store.pool();
        Ok(Tables {
            states: sqlx::query_as("SELECT order_no, status FROM pay_orders")
                .fetch_all(pool)
                .await?,
            coupons: sqlx::query_as("SELECT order_no, COUNT(*) FROM coupons GROUP BY order_no")
                .fetch_all(pool)
                .await?,
            ledger_sum: sqlx::query_scalar("SELECT COALESCE(SUM(amount), 0)::BIGINT FROM ledger")
                .fetch_one(pool)
                .await?,
            history: sqlx::query_as("SELECT order_no, status FROM history ORDER BY seq")
                .fetch_all(pool)
                .await?,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_pay_callback_storm_changes_nothing_it_should_not() {
    let Some((pool, schema)) = pg::schema_pool(32).await else {
        return;
    };
    let backend = Arc::new(Pg {
        store: PgStore::from_pool(pool.clone()),
    });
    let report = scenario::run(backend).await.unwrap();
    report.check().unwrap();
    assert_eq!(report.deliveries, 47);
    assert_eq!(report.outcomes.get("applied"), Some(&21), "{report:?}");
    assert_eq!(
        report.outcomes.get("already_applied"),
        Some(&15),
        "{report:?}"
    );
    assert_eq!(report.outcomes.get("rejected"), Some(&11), "{report:?}");
    let count = |state| report.states.values().filter(|s| **s == state).count();
    assert_eq!(count(PayStatus::Refunded), 5);
    assert_eq!(count(PayStatus::Paid), 11);
    assert_eq!(count(PayStatus::WaitPay), 4);
    assert_eq!(report.coupons.values().sum::<i64>(), 16);
    assert_eq!(report.ledger_sum, 11 * scenario::AMOUNT);
    pg::drop_schema(&pool, &schema).await;
}
