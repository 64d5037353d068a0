//! A payment incident, modelled: a gateway retries payment callbacks for six minutes, 47
//! deliveries, among them refund callbacks that would move paid orders to REFUNDED. Here every callback is a
//! `#[state_transition]`: duplicates are `AlreadyApplied`, late or illegal moves are `Rejected`, the
//! coupon and the ledger rows are written only by the transition that applied.
//!
//! The transitions are generic over the connection (`C: TransitionConn`) and write the business rows
//! through it, so one scenario runs on every backend: a [`Backend`] sets the tables up, begins and
//! commits the delivery transactions, and reads the tables back for the audit. [`Sqlite`] is the
//! embedded one; each server store's suite adds its own.
//!
//! Shared by `examples/pay_callback.rs` (prints the report) and `tests/pay_callback.rs` (asserts it).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use idem::sqlx;
use idem::state_machine::{Dialect, SqlValue, TransitionConn};
use idem::{IdemError, SqliteStore, SqliteTx, Transition, state_transition};

/// The order's life: paid once, refunded only after a refund request, nothing leaves a terminal state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, idem::StateMachine)]
#[state_machine(table = "pay_orders", key = "order_no", status = "status")]
pub enum PayStatus {
    #[state(to(Paid, Closed))]
    WaitPay,
    #[state(to(Refunding))]
    Paid,
    #[state(to(Refunded))]
    Refunding,
    #[state(terminal)]
    Refunded,
    #[state(terminal)]
    Closed,
}

/// What went wrong in a handler.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// idem's refusal, a store failure, or a failed business write.
    #[error(transparent)]
    Idem(#[from] IdemError),
    /// The setup or the audit failed.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl idem::RestartsTransaction for ScenarioError {
    fn restarts_transaction(&self) -> bool {
        matches!(self, ScenarioError::Idem(e) if e.restarts_transaction())
    }
}

/// Where the scenario runs: a database with the tables `pay_orders`, `coupons`, `ledger` and
/// `history` (see [`Sqlite::setup`] for their columns, in SQLite's words).
pub trait Backend: Send + Sync + 'static {
    /// A delivery's transaction.
    type Tx: TransitionConn + Send;

    /// Begins a delivery's transaction.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, ScenarioError>> + Send;

    /// Commits it.
    fn commit(tx: Self::Tx) -> impl Future<Output = Result<(), ScenarioError>> + Send;

    /// Creates the tables (empty) and the orders, all `WAIT_PAY`.
    fn setup(&self, orders: &[String]) -> impl Future<Output = Result<(), ScenarioError>> + Send;

    /// The audit's view of the tables.
    fn read_back(&self) -> impl Future<Output = Result<Tables, ScenarioError>> + Send;
}

/// The tables as the audit reads them.
#[derive(Debug, Default)]
pub struct Tables {
    /// (order, state) of every order.
    pub states: Vec<(String, PayStatus)>,
    /// (order, coupons) of every order that has one.
    pub coupons: Vec<(String, i64)>,
    /// Sum of the ledger, in cents.
    pub ledger_sum: i64,
    /// (order, state) of the history, in the order it was written.
    pub history: Vec<(String, PayStatus)>,
}

/// One business write, in the connection's dialect (`?` or `$n` placeholders).
async fn write<C: TransitionConn>(
    tx: &mut C,
    sqlite_and_mysql: &'static str,
    postgres: &'static str,
    args: &[SqlValue<'_>],
) -> Result<(), ScenarioError> {
    let sql = match tx.dialect() {
        Dialect::Postgres => postgres,
        _ => sqlite_and_mysql,
    };
    tx.execute(sql, args).await?;
    Ok(())
}

/// Price of every order, in cents (¥299, a typical order).
pub const AMOUNT: i64 = 29_900;
/// Orders in the scenario.
pub const ORDERS: usize = 20;

/// One delivery from the payment gateway.
#[derive(Debug, Clone)]
pub enum Callback {
    /// "Order paid", with the gateway's trade number.
    Paid { order_no: String, trade_no: String },
    /// "Refund done", with the gateway's refund number.
    Refunded { order_no: String, refund_no: String },
}

/// Payment callback: WAIT_PAY → PAID; the same trade_no again is a repeat. Issues the coupon and
/// books the payment in the same transaction.
#[state_transition(
    from = "WAIT_PAY",
    to = "PAID",
    key = "order_no",
    set(trade_no = "trade_no"),
    now = "paid_at",
    match(trade_no)
)]
pub async fn on_paid<C: TransitionConn>(
    tx: &mut C,
    order_no: &str,
    trade_no: &str,
) -> Result<Transition<(), PayStatus>, ScenarioError> {
    write(
        tx,
        "INSERT INTO coupons (order_no) VALUES (?)",
        "INSERT INTO coupons (order_no) VALUES ($1)",
        &[SqlValue::Text(order_no.into())],
    )
    .await?;
    book(tx, order_no, "PAY", AMOUNT).await?;
    history(tx, order_no, PayStatus::Paid).await
}

/// The user asks for a refund: PAID → REFUNDING.
#[state_transition(from = "PAID", to = "REFUNDING")]
pub async fn request_refund<C: TransitionConn>(
    tx: &mut C,
    order_no: &str,
) -> Result<Transition<(), PayStatus>, ScenarioError> {
    history(tx, order_no, PayStatus::Refunding).await
}

/// Refund callback: REFUNDING → REFUNDED only. The incident's failure is a refund callback applied
/// to a PAID order; here that is `Rejected { current: Paid }`.
#[state_transition(
    from = "REFUNDING",
    to = "REFUNDED",
    set(refund_no = "refund_no"),
    match(refund_no)
)]
pub async fn on_refunded<C: TransitionConn>(
    tx: &mut C,
    order_no: &str,
    refund_no: &str,
) -> Result<Transition<(), PayStatus>, ScenarioError> {
    book(tx, order_no, "REFUND", -AMOUNT).await?;
    history(tx, order_no, PayStatus::Refunded).await
}

async fn book<C: TransitionConn>(
    tx: &mut C,
    order_no: &str,
    kind: &str,
    amount: i64,
) -> Result<(), ScenarioError> {
    write(
        tx,
        "INSERT INTO ledger (order_no, kind, amount) VALUES (?, ?, ?)",
        "INSERT INTO ledger (order_no, kind, amount) VALUES ($1, $2, $3)",
        &[
            SqlValue::Text(order_no.into()),
            SqlValue::Text(kind.into()),
            SqlValue::Int(amount),
        ],
    )
    .await
}

async fn history<C: TransitionConn>(
    tx: &mut C,
    order_no: &str,
    to: PayStatus,
) -> Result<(), ScenarioError> {
    write(
        tx,
        "INSERT INTO history (order_no, status) VALUES (?, ?)",
        "INSERT INTO history (order_no, status) VALUES ($1, $2)",
        &[
            SqlValue::Text(order_no.into()),
            SqlValue::Text(idem::StateMachine::as_str(to).into()),
        ],
    )
    .await
}

pub fn order_no(i: usize) -> String {
    format!("O{i:02}")
}

fn paid(i: usize) -> Callback {
    Callback::Paid {
        order_no: order_no(i),
        trade_no: format!("T{i:02}"),
    }
}

fn refunded(i: usize) -> Callback {
    Callback::Refunded {
        order_no: order_no(i),
        refund_no: format!("R{i:02}"),
    }
}

/// The 21 deliveries before the incident (16 payments; 5 refund requests, then their 5 refunds) and the
/// 26 of the retry storm: a duplicate payment for 15 orders (5 of them already refunded: a late PAID)
/// and a refund callback for 11 orders, 6 of which never asked for one (the incident in miniature:
/// refund callbacks for 11 orders). 47 in all.
pub fn deliveries() -> (Vec<Callback>, Vec<usize>, Vec<Callback>, Vec<Callback>) {
    let payments: Vec<Callback> = (0..16).map(paid).collect();
    let refund_requests: Vec<usize> = (0..5).collect();
    let refunds: Vec<Callback> = (0..5).map(refunded).collect();
    let mut storm: Vec<Callback> = (0..15).map(paid).chain((0..11).map(refunded)).collect();
    // Out of order, deterministically: a fixed permutation (7 is coprime with 26).
    let n = storm.len();
    storm = (0..n).map(|i| storm[(i * 7 + 3) % n].clone()).collect();
    (payments, refund_requests, refunds, storm)
}

/// Tally of what each delivery got, and the audited end state.
#[derive(Debug, Default)]
pub struct Report {
    /// Deliveries handled.
    pub deliveries: usize,
    /// Outcome name → count.
    pub outcomes: BTreeMap<&'static str, usize>,
    /// Late or illegal deliveries: (order, callback kind, the state that refused it).
    pub rejected: Vec<(String, &'static str, PayStatus)>,
    /// Final state per order.
    pub states: BTreeMap<String, PayStatus>,
    /// Coupons per order.
    pub coupons: BTreeMap<String, i64>,
    /// Sum of the ledger, in cents.
    pub ledger_sum: i64,
    /// States each order went through, in order.
    pub history: BTreeMap<String, Vec<PayStatus>>,
}

impl Report {
    /// Every invariant the scenario must keep, checked; the first broken one is the error.
    ///
    /// # Errors
    /// A description of the broken invariant.
    pub fn check(&self) -> Result<(), String> {
        use PayStatus::*;
        for (order, path) in &self.history {
            let forward = [Paid, Refunding, Refunded];
            if !forward.starts_with(path) {
                return Err(format!(
                    "{order} moved {path:?}, not forward along PAID → REFUNDING → REFUNDED"
                ));
            }
            if self.states.get(order) != path.last() {
                return Err(format!(
                    "{order} ends in {:?} but its history ends in {:?}",
                    self.states.get(order),
                    path.last()
                ));
            }
        }
        for (order, state) in &self.states {
            let ever_paid = !matches!(state, WaitPay | Closed);
            let coupons = self.coupons.get(order).copied().unwrap_or(0);
            if coupons != i64::from(ever_paid) {
                return Err(format!("{order} ({state:?}) has {coupons} coupons"));
            }
        }
        let kept = self
            .states
            .values()
            .filter(|s| matches!(s, Paid | Refunding))
            .count() as i64;
        if self.ledger_sum != kept * AMOUNT {
            return Err(format!(
                "ledger holds {} cents, but {kept} orders keep a payment of {AMOUNT}",
                self.ledger_sum
            ));
        }
        Ok(())
    }
}

/// The scenario on a fresh SQLite file.
pub struct Sqlite(pub SqliteStore);

impl Sqlite {
    /// A fresh database file at `path`.
    ///
    /// # Errors
    /// The store's error.
    pub async fn open(path: &Path) -> Result<Self, ScenarioError> {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        Ok(Sqlite(SqliteStore::open(path).await?))
    }
}

impl Backend for Sqlite {
    type Tx = SqliteTx;

    async fn begin(&self) -> Result<SqliteTx, ScenarioError> {
        Ok(self.0.begin().await?)
    }

    async fn commit(tx: SqliteTx) -> Result<(), ScenarioError> {
        Ok(tx.commit().await?)
    }

    async fn setup(&self, orders: &[String]) -> Result<(), ScenarioError> {
        let pool = self.0.pool();
        for ddl in [
            "CREATE TABLE pay_orders (order_no TEXT PRIMARY KEY, status TEXT NOT NULL, \
             trade_no TEXT, refund_no TEXT, paid_at TEXT)",
            // No unique index on coupons or the ledger: only the transitions keep them single.
            "CREATE TABLE coupons (order_no TEXT NOT NULL)",
            "CREATE TABLE ledger (order_no TEXT NOT NULL, kind TEXT NOT NULL, amount INTEGER NOT NULL)",
            "CREATE TABLE history (seq INTEGER PRIMARY KEY, order_no TEXT NOT NULL, status TEXT NOT NULL)",
        ] {
            sqlx::query(ddl).execute(pool).await?;
        }
        for order in orders {
            sqlx::query("INSERT INTO pay_orders (order_no, status) VALUES (?, ?)")
                .bind(order)
                .bind(PayStatus::WaitPay)
                .execute(pool)
                .await?;
        }
        Ok(())
    }

    async fn read_back(&self) -> Result<Tables, ScenarioError> {
        let pool = self.0.pool();
        Ok(Tables {
            states: sqlx::query_as("SELECT order_no, status FROM pay_orders")
                .fetch_all(pool)
                .await?,
            coupons: sqlx::query_as("SELECT order_no, COUNT(*) FROM coupons GROUP BY order_no")
                .fetch_all(pool)
                .await?,
            ledger_sum: sqlx::query_scalar("SELECT COALESCE(SUM(amount), 0) FROM ledger")
                .fetch_one(pool)
                .await?,
            history: sqlx::query_as("SELECT order_no, status FROM history ORDER BY seq")
                .fetch_all(pool)
                .await?,
        })
    }
}

/// Runs the scenario on `backend` (its tables must not exist yet).
///
/// # Errors
/// A store or database failure.
pub async fn run<B: Backend>(backend: Arc<B>) -> Result<Report, ScenarioError> {
    let orders: Vec<String> = (0..ORDERS).map(order_no).collect();
    backend.setup(&orders).await?;

    let (payments, refund_requests, refunds, storm) = deliveries();
    let mut report = Report::default();
    for callback in payments {
        let outcome = deliver(&*backend, &callback).await?;
        tally(&mut report, &callback, outcome);
    }
    for i in refund_requests {
        let mut tx = backend.begin().await?;
        let outcome = request_refund(&mut tx, &order_no(i)).await?;
        B::commit(tx).await?;
        assert!(
            outcome.is_applied(),
            "refund request of {}: {outcome:?}",
            order_no(i)
        );
    }
    for callback in refunds {
        let outcome = deliver(&*backend, &callback).await?;
        tally(&mut report, &callback, outcome);
    }
    // The retry storm: every delivery at once, released together.
    let barrier = Arc::new(tokio::sync::Barrier::new(storm.len()));
    let tasks: Vec<_> = storm
        .into_iter()
        .map(|callback| {
            let (backend, barrier) = (backend.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let outcome = deliver(&*backend, &callback).await;
                (callback, outcome)
            })
        })
        .collect();
    for task in tasks {
        let (callback, outcome) = task.await.expect("delivery task");
        tally(&mut report, &callback, outcome?);
    }

    // The audit, from the tables.
    let tables = backend.read_back().await?;
    report.states = tables.states.into_iter().collect();
    report.coupons = tables.coupons.into_iter().collect();
    report.ledger_sum = tables.ledger_sum;
    for (order, status) in tables.history {
        report.history.entry(order).or_default().push(status);
    }
    Ok(report)
}

/// One delivery in its own transaction, as a callback handler would run it (run again if the
/// database rolled it back).
async fn deliver<B: Backend>(
    backend: &B,
    callback: &Callback,
) -> Result<Transition<(), PayStatus>, ScenarioError> {
    idem::retry_transaction(|| async {
        let mut tx = backend.begin().await?;
        let outcome = match callback {
            Callback::Paid { order_no, trade_no } => on_paid(&mut tx, order_no, trade_no).await?,
            Callback::Refunded {
                order_no,
                refund_no,
            } => on_refunded(&mut tx, order_no, refund_no).await?,
        };
        B::commit(tx).await?;
        Ok(outcome)
    })
    .await
}

fn tally(report: &mut Report, callback: &Callback, outcome: Transition<(), PayStatus>) {
    report.deliveries += 1;
    let (order, kind) = match callback {
        Callback::Paid { order_no, .. } => (order_no, "PAID callback"),
        Callback::Refunded { order_no, .. } => (order_no, "REFUNDED callback"),
    };
    let name = match outcome {
        Transition::Applied(()) => "applied",
        Transition::AlreadyApplied => "already_applied",
        Transition::Rejected { current } => {
            report.rejected.push((order.clone(), kind, current));
            "rejected"
        }
        Transition::VersionConflict { .. } => "version_conflict",
        Transition::NotFound => "not_found",
    };
    *report.outcomes.entry(name).or_default() += 1;
}
