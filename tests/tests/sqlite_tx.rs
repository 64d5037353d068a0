//! `#[idempotent(tx = "tx")]` on SQLite, through the macro: the transaction from `store.begin()`
//! carries its store, so the attribute needs no `store = …`; claim, business writes and mark commit
//! or roll back together; the call is reported like any other (span, counters, `observe`). The
//! semantics for every backend are in the tx contract suite (`tests/contract/tx.rs`).

use std::sync::{Arc, Mutex};

use idem::metrics::Outcome;
use idem::sqlx::{self, SqlitePool};
use idem::{IdemError, SqliteStore, SqliteTx, Store, idempotent, store::Status};
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
    fence: u64,
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

/// One file database per test binary, with an `orders` table (no unique constraint: only idem
/// keeps it free of duplicates).
/// Held by every test of this file: the span test's subscriber is this thread's only, and a call
/// on another thread that registers the span's callsite at the same moment can leave it cached as
/// of interest to nobody (seen once in a few hundred runs). The tests take milliseconds.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
            store
        })
        .await
}

async fn orders(pool: &SqlitePool, order_no: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE order_no = ?1")
        .bind(order_no)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[idempotent(biz = "TXPAY", key = "req.order_no", tx = "tx", fingerprint = "req")]
async fn pay(tx: &mut SqliteTx, req: &PayReq, decline: bool) -> Result<Receipt, PayError> {
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
        fence: idem::steps::current_claim()
            .expect("the body holds a claim")
            .fence
            .get(),
    })
}

fn req(order_no: &str) -> PayReq {
    PayReq {
        order_no: order_no.to_owned(),
        amount: 100,
    }
}

#[tokio::test]
async fn commit_keeps_claim_business_and_mark_together_and_a_repeat_replays() {
    let _serial = SERIAL.lock().await;
    let store = store().await;
    let pool = store.pool();
    let mut tx = store.begin().await.unwrap();
    let (first, report) = idem::metrics::observe(pay(&mut tx, &req("T-1"), false)).await;
    tx.commit().await.unwrap();
    let first = first.unwrap();
    assert_eq!(report.unwrap().outcome, Outcome::Executed);
    let rec = store.load("TXPAY", "T-1").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.attempt), (Status::Succeeded, 1));
    assert_eq!(
        first.fence,
        rec.fence.get(),
        "the body saw its claim's fence"
    );

    let mut tx = store.begin().await.unwrap();
    let (again, report) = idem::metrics::observe(pay(&mut tx, &req("T-1"), false)).await;
    tx.commit().await.unwrap();
    assert_eq!(again.unwrap(), first);
    assert!(report.unwrap().replayed());
    assert_eq!(orders(pool, "T-1").await, 1);
}

#[tokio::test]
async fn body_error_rolls_back_the_claim_and_the_business_writes() {
    let _serial = SERIAL.lock().await;
    let store = store().await;
    let pool = store.pool();
    let mut tx = store.begin().await.unwrap();
    let (res, report) = idem::metrics::observe(pay(&mut tx, &req("T-2"), true)).await;
    assert!(matches!(res, Err(PayError::Declined)), "{res:?}");
    assert_eq!(report.unwrap().outcome, Outcome::Failed);
    tx.commit().await.unwrap();
    assert!(store.load("TXPAY", "T-2").await.unwrap().is_none());
    assert_eq!(orders(pool, "T-2").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_in_transactions_execute_once() {
    let _serial = SERIAL.lock().await;
    let store = store().await;
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (store, barrier) = (store.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let mut tx = store.begin().await.unwrap();
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

/// A tx-mode call is an `idem` span with its outcome and attempt, like a lease-mode call.
#[test]
fn a_transactional_call_is_a_span_with_its_outcome() {
    let _serial = SERIAL.blocking_lock();
    use tracing::field::{Field, Visit};
    use tracing_subscriber::layer::SubscriberExt;

    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<(String, String)>>>);
    struct Visitor<'a>(&'a Mutex<Vec<(String, String)>>);
    impl Visit for Visitor<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0
                .lock()
                .unwrap()
                .push((field.name().to_owned(), format!("{value:?}")));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0
                .lock()
                .unwrap()
                .push((field.name().to_owned(), value.to_owned()));
        }
    }
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Seen {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            if attrs.metadata().name() == "idem" {
                attrs.record(&mut Visitor(&self.0));
            }
        }
        fn on_record(
            &self,
            _: &tracing::span::Id,
            values: &tracing::span::Record<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            values.record(&mut Visitor(&self.0));
        }
    }

    let seen = Seen::default();
    let subscriber = tracing_subscriber::registry().with(seen.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            let store = SqliteStore::in_memory().await.unwrap();
            store.migrate().await.unwrap();
            sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, order_no TEXT NOT NULL, amount INTEGER NOT NULL)")
                .execute(store.pool())
                .await
                .unwrap();
            let mut tx = store.begin().await.unwrap();
            pay(&mut tx, &req("S-1"), false).await.unwrap();
            tx.commit().await.unwrap();
        })
    });
    let fields = seen.0.lock().unwrap().clone();
    for expected in [("biz", "TXPAY"), ("outcome", "executed"), ("attempt", "1")] {
        assert!(
            fields
                .iter()
                .any(|(k, v)| (k.as_str(), v.as_str()) == expected),
            "{expected:?} in {fields:?}"
        );
    }
}

/// Deletes the `TXPAY` record of `order_no` with the transaction's own connection (what no caller
/// should do: it stands for anything that changes a claimed record before its mark lands).
async fn delete_record(tx: &mut SqliteTx, order_no: &str) {
    sqlx::query("DELETE FROM idem_record WHERE biz_type = 'TXPAY' AND idem_key = ?1")
        .bind(order_no)
        .execute(&mut **tx)
        .await
        .unwrap();
}

/// Commits `tx`, which must be refused: a mark of its first attempt did not land.
async fn commit_refused(tx: SqliteTx) {
    let committed = tx.commit().await;
    assert!(
        matches!(committed, Err(IdemError::LeaseLost { attempt: 1 })),
        "{committed:?}"
    );
}

/// On SQLite the last mark goes with the `COMMIT`, in one round trip: the commit runs only when
/// the mark changed its record. A record the transaction itself deleted after the call makes the
/// commit fail and roll everything back (no business row, no record), and the store's connection
/// serves the next transaction as before.
#[tokio::test]
async fn a_commit_whose_mark_finds_no_record_commits_nothing() {
    let _serial = SERIAL.lock().await;
    let store = store().await;
    let pool = store.pool();
    let mut tx = store.begin().await.unwrap();
    pay(&mut tx, &req("T-20"), false).await.unwrap();
    delete_record(&mut tx, "T-20").await;
    commit_refused(tx).await;
    assert!(store.load("TXPAY", "T-20").await.unwrap().is_none());
    assert_eq!(
        orders(pool, "T-20").await,
        0,
        "the business write rolled back"
    );

    // The next transactions, on the same connection, run and commit as usual.
    for _ in 0..2 {
        let mut tx = store.begin().await.unwrap();
        pay(&mut tx, &req("T-20"), false).await.unwrap();
        tx.commit().await.unwrap();
    }
    let rec = store.load("TXPAY", "T-20").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.attempt), (Status::Succeeded, 1));
    assert_eq!(orders(pool, "T-20").await, 1, "the repeat replayed");
}

/// A second call in the same transaction sends the first call's mark ahead of its claim. When
/// that mark does not land, the second call fails and so does the commit: the first call was
/// answered as done, so its business write must not commit without its record.
#[tokio::test]
async fn a_mark_sent_ahead_of_the_next_claim_that_does_not_land_fails_the_commit() {
    let _serial = SERIAL.lock().await;
    let store = store().await;
    let pool = store.pool();
    let mut tx = store.begin().await.unwrap();
    pay(&mut tx, &req("T-21"), false).await.unwrap();
    delete_record(&mut tx, "T-21").await;
    let second = pay(&mut tx, &req("T-22"), false).await;
    assert!(
        matches!(second, Err(PayError::Idem(IdemError::LeaseLost { .. }))),
        "{second:?}"
    );
    commit_refused(tx).await;
    for order_no in ["T-21", "T-22"] {
        assert!(store.load("TXPAY", order_no).await.unwrap().is_none());
        assert_eq!(orders(pool, order_no).await, 0, "{order_no} rolled back");
    }
}
