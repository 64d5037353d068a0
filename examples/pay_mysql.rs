//! A payment's `pay()` on MySQL / MariaDB: the account balance, the pay flow and the dedup record
//! change in ONE transaction, under a concurrent retry storm at 12 % duplicates.
//!
//! ```text
//! cargo run -p idem-suite --example pay_mysql --features mysql
//! IDEM_MYSQL_URL=mysql://user:pass@host:3306/db cargo run -p idem-suite --example pay_mysql --features mysql
//! ```
//!
//! It makes a database of its own (`idem_example_pay`, dropped and made again on every run) on the
//! server of `IDEM_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`), opens 50 accounts,
//! and delivers 2,000 payments plus 240 duplicates (12 %) from 32 concurrent workers, each
//! duplicate sent close behind its original, as a gateway retrying after a timeout does. A
//! delivery is one transaction: `pay()` claims the order number in it, debits the account and
//! writes the flow row; a deadlock victim runs its transaction again (`idem::retry_transaction`),
//! and a duplicate that found the first still running (`InProgress`) is delivered again later.
//! At the end every balance and the flow table must be exact: one flow row and one debit per
//! order, whatever the duplicates did.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem::metrics::Outcome;
use idem::sqlx::{self, AssertSqlSafe};
use idem::{IdemError, MySqlStore, MySqlTx, idempotent};
use serde::{Deserialize, Serialize};

const ACCOUNTS: u64 = 50;
const ORDERS: u64 = 2_000;
const DUPLICATE_PERCENT: u64 = 12;
const WORKERS: usize = 32;
const OPENING_BALANCE: i64 = 10_000_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PayReq {
    order_no: String,
    user_id: u64,
    amount_cents: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order_no: String,
    flow_id: u64,
    balance_after: i64,
}

#[derive(Debug, thiserror::Error)]
enum PayError {
    #[error("insufficient funds")]
    InsufficientFunds,
    #[error(transparent)]
    Idem(#[from] IdemError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl idem::RestartsTransaction for PayError {
    fn restarts_transaction(&self) -> bool {
        match self {
            PayError::Idem(e) => e.restarts_transaction(),
            // The business's own statements can be deadlock victims too (1213, SQLSTATE 40001).
            PayError::Db(sqlx::Error::Database(db)) => db.code().as_deref() == Some("40001"),
            _ => false,
        }
    }
}

/// `pay()`: the dedup record, the debit and the flow row in the caller's transaction.
#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx", fingerprint = "req")]
async fn pay(tx: &mut MySqlTx, req: &PayReq) -> Result<Receipt, PayError> {
    let debited =
        sqlx::query("UPDATE account SET balance = balance - ? WHERE user_id = ? AND balance >= ?")
            .bind(req.amount_cents)
            .bind(req.user_id)
            .bind(req.amount_cents)
            .execute(&mut **tx)
            .await?
            .rows_affected();
    if debited != 1 {
        return Err(PayError::InsufficientFunds);
    }
    let flow_id = sqlx::query("INSERT INTO pay_flow (order_no, user_id, amount) VALUES (?, ?, ?)")
        .bind(&req.order_no)
        .bind(req.user_id)
        .bind(req.amount_cents)
        .execute(&mut **tx)
        .await?
        .last_insert_id();
    let balance_after: i64 = sqlx::query_scalar("SELECT balance FROM account WHERE user_id = ?")
        .bind(req.user_id)
        .fetch_one(&mut **tx)
        .await?;
    Ok(Receipt {
        order_no: req.order_no.clone(),
        flow_id,
        balance_after,
    })
}

/// The deliveries: every order once, and 12 % of them again, each duplicate a few places behind
/// its original (a deterministic shuffle, so runs compare).
fn deliveries() -> Vec<PayReq> {
    let order = |i: u64| PayReq {
        order_no: format!("ORD-{i:05}"),
        user_id: i % ACCOUNTS,
        amount_cents: 100 + (i as i64 * 7919) % 9_900,
    };
    let mut out: Vec<PayReq> = (0..ORDERS).map(order).collect();
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let duplicates = ORDERS * DUPLICATE_PERCENT / 100;
    let mut picked = std::collections::BTreeSet::new();
    while (picked.len() as u64) < duplicates {
        picked.insert(next() % ORDERS);
    }
    // Insert from the back so earlier positions stay valid.
    for &i in picked.iter().rev() {
        let at = (i as usize + 1 + (next() % 8) as usize).min(out.len());
        out.insert(at, order(i));
    }
    out
}

async fn setup(url: &str) -> Result<MySqlStore, PayError> {
    let admin = MySqlStore::connect_with(url, 1, Duration::from_secs(2)).await?;
    for sql in [
        "DROP DATABASE IF EXISTS idem_example_pay",
        "CREATE DATABASE idem_example_pay",
    ] {
        sqlx::raw_sql(sql).execute(admin.pool()).await?;
    }
    let (base, _) = url.rsplit_once('/').expect("a URL with a database");
    let store = MySqlStore::connect_with(
        &format!("{base}/idem_example_pay"),
        WORKERS as u32 + 4,
        Duration::from_secs(2),
    )
    .await?;
    store.migrate().await?; // idem_record (and idem_token)
    for ddl in [
        "CREATE TABLE account (user_id BIGINT UNSIGNED PRIMARY KEY, balance BIGINT NOT NULL) \
         ENGINE = InnoDB",
        // No unique key on order_no: only idem keeps the flow single.
        "CREATE TABLE pay_flow (id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY, \
         order_no VARCHAR(32) NOT NULL, user_id BIGINT UNSIGNED NOT NULL, amount BIGINT NOT NULL) \
         ENGINE = InnoDB",
    ] {
        sqlx::query(ddl).execute(store.pool()).await?;
    }
    let values: Vec<String> = (0..ACCOUNTS)
        .map(|u| format!("({u}, {OPENING_BALANCE})"))
        .collect();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO account (user_id, balance) VALUES {}",
        values.join(", ")
    )))
    .execute(store.pool())
    .await?;
    Ok(store)
}

#[derive(Default)]
struct Tally {
    outcomes: BTreeMap<&'static str, u64>,
    restarts: AtomicU64,
    redelivered: AtomicU64,
}

/// One delivery, as the callback handler runs it: a transaction, run again when InnoDB rolled it
/// back; delivered again later when the first delivery of the order is still in flight.
async fn deliver(store: &MySqlStore, req: &PayReq, tally: &Tally) -> Result<Outcome, PayError> {
    loop {
        let attempt = idem::retry_transaction(|| async {
            let mut tx = store.begin().await?;
            let (out, report) = idem::metrics::observe(pay(&mut tx, req)).await;
            match out {
                Ok(_) => {
                    tx.commit().await?;
                    Ok(report.map_or(Outcome::Executed, |r| r.outcome))
                }
                Err(e) => {
                    if idem::RestartsTransaction::restarts_transaction(&e) {
                        tally.restarts.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e)
                }
            }
        })
        .await;
        match attempt {
            Err(PayError::Idem(IdemError::InProgress { .. })) => {
                tally.redelivered.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            done => return done,
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), PayError> {
    let url = std::env::var("IDEM_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    let store = setup(&url).await?;
    let queue = Arc::new(std::sync::Mutex::new(
        deliveries().into_iter().rev().collect::<Vec<_>>(),
    ));
    let total = queue.lock().unwrap().len();
    let expected: BTreeMap<u64, i64> = (0..ORDERS).fold(BTreeMap::new(), |mut m, i| {
        *m.entry(i % ACCOUNTS).or_default() += 100 + (i as i64 * 7919) % 9_900;
        m
    });

    let started = Instant::now();
    let tally = Arc::new(Tally::default());
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (store, queue, tally) = (store.clone(), queue.clone(), tally.clone());
            tokio::spawn(async move {
                let mut seen: Vec<Outcome> = Vec::new();
                loop {
                    let Some(req) = queue.lock().unwrap().pop() else {
                        return Ok::<_, PayError>(seen);
                    };
                    seen.push(deliver(&store, &req, &tally).await?);
                }
            })
        })
        .collect();
    let mut outcomes: BTreeMap<&'static str, u64> = BTreeMap::new();
    for worker in workers {
        for outcome in worker.await.expect("worker")? {
            *outcomes.entry(outcome.as_str()).or_default() += 1;
        }
    }
    let elapsed = started.elapsed();
    let mut tally = Arc::try_unwrap(tally).ok().expect("workers done");
    tally.outcomes = outcomes;

    // The audit, from the tables.
    let flows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM pay_flow")
        .fetch_one(store.pool())
        .await?;
    let distinct: i64 = sqlx::query_scalar("SELECT COUNT(DISTINCT order_no) FROM pay_flow")
        .fetch_one(store.pool())
        .await?;
    let records: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM idem_record WHERE biz_type = 'PAY' AND status = 'SUCCEEDED'",
    )
    .fetch_one(store.pool())
    .await?;
    let balances: Vec<(u64, i64)> =
        sqlx::query_as("SELECT user_id, balance FROM account ORDER BY user_id")
            .fetch_all(store.pool())
            .await?;
    let wrong: Vec<_> = balances
        .iter()
        .filter(|(user, balance)| OPENING_BALANCE - expected[user] != *balance)
        .collect();
    let debited: i64 = balances.iter().map(|(_, b)| OPENING_BALANCE - b).sum();

    println!(
        "{total} deliveries ({ORDERS} orders + {} duplicates, {DUPLICATE_PERCENT} %) from {WORKERS} workers in {:.2} s",
        total as u64 - ORDERS,
        elapsed.as_secs_f64()
    );
    println!("outcomes: {:?}", tally.outcomes);
    println!(
        "transactions restarted after a deadlock: {}, duplicates delivered again after InProgress: {}",
        tally.restarts.load(Ordering::Relaxed),
        tally.redelivered.load(Ordering::Relaxed)
    );
    println!(
        "pay_flow rows: {flows} ({distinct} distinct orders); SUCCEEDED records: {records}; \
         debited in all: {debited} cents; accounts off: {}",
        wrong.len()
    );
    assert_eq!(flows, ORDERS as i64, "one flow row per order");
    assert_eq!(distinct, ORDERS as i64);
    assert_eq!(records, ORDERS as i64);
    assert!(wrong.is_empty(), "balances off: {wrong:?}");
    assert_eq!(debited, expected.values().sum::<i64>());
    assert_eq!(
        tally.outcomes.get("executed").copied().unwrap_or(0),
        ORDERS,
        "each order executed once"
    );
    assert_eq!(
        tally.outcomes.get("replayed").copied().unwrap_or(0),
        total as u64 - ORDERS,
        "each duplicate replayed"
    );
    println!("balances and flow rows are exact");
    Ok(())
}
