//! Quickstart on the embedded SQLite store (a file, no server).
//!
//! A small payment flow: the first call executes, a repeat replays, 16 concurrent duplicates
//! execute once, another payload under the same key is refused, and a failure is followed by a
//! successful retry. Run it twice: the second run replays everything from the file.
//!
//! ```text
//! cargo run --example quickstart            # uses ./idem-quickstart.db
//! cargo run --example quickstart -- my.db   # another file
//! IDEM_STORE_URL=redis://127.0.0.1:6379 cargo run --example quickstart --features redis
//! ```
//!
//! The records go to the store `IDEM_STORE_URL` names (`idem::connect`: `sqlite:PATH`,
//! `postgres://…`, `mysql://…`, `redis://…`, …), by default the SQLite file; the ledger (the
//! business's own table) is always in the SQLite file.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use idem::{IdemError, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PayReq {
    order_no: String,
    amount_cents: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Receipt {
    order_no: String,
    amount_cents: u64,
    txn: i64,
}

#[derive(Debug, thiserror::Error)]
enum PayError {
    #[error("payment gateway unavailable")]
    GatewayDown,
    #[error(transparent)]
    Idem(#[from] IdemError),
}

/// Simulates an outage of the payment gateway for the "failure then retry" step.
static GATEWAY_DOWN: AtomicBool = AtomicBool::new(false);

/// The business. `#[idempotent]` makes it run at most once per order number: repeats replay the
/// stored receipt, concurrent repeats are told "in progress", another amount under the same order
/// number is refused, and an error lets a retry run.
#[idempotent(
    biz = "PAY",
    key = "req.order_no",
    store = "sqlite",
    fingerprint = "req"
)]
async fn pay(ledger: &idem::sqlx::SqlitePool, req: &PayReq) -> Result<Receipt, PayError> {
    if GATEWAY_DOWN.load(Ordering::SeqCst) {
        return Err(PayError::GatewayDown);
    }
    // The side effect: one ledger row per real execution.
    let txn = idem::sqlx::query("INSERT INTO ledger (order_no, amount_cents) VALUES (?1, ?2)")
        .bind(&req.order_no)
        .bind(req.amount_cents as i64)
        .execute(ledger)
        .await
        .map_err(IdemError::store)?
        .last_insert_rowid();
    Ok(Receipt {
        order_no: req.order_no.clone(),
        amount_cents: req.amount_cents,
        txn,
    })
}

async fn executions(ledger: &idem::sqlx::SqlitePool, order_no: &str) -> i64 {
    idem::sqlx::query_scalar("SELECT COUNT(*) FROM ledger WHERE order_no = ?1")
        .bind(order_no)
        .fetch_one(ledger)
        .await
        .expect("ledger readable")
}

fn describe(
    res: &Result<Receipt, PayError>,
    report: Option<&idem::metrics::CallReport>,
) -> (String, String) {
    let outcome = report.map_or("-", |r| r.outcome.as_str()).to_owned();
    let answer = match res {
        Ok(r) => format!("receipt txn={}", r.txn),
        Err(PayError::Idem(e)) => format!("{} ({})", short(e), e.http_status()),
        Err(e) => e.to_string(),
    };
    (outcome, answer)
}

fn short(e: &IdemError) -> &'static str {
    match e {
        IdemError::InProgress { .. } => "InProgress",
        IdemError::PayloadMismatch => "PayloadMismatch",
        _ => "IdemError",
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "idem-quickstart.db".to_owned());
    let url = std::env::var("IDEM_STORE_URL").unwrap_or_else(|_| format!("sqlite:{path}"));
    let store = idem::connect(&url).await?;
    store.migrate().await?;
    let ledger = idem::sqlx::sqlite::SqlitePoolOptions::new()
        .connect_with(
            idem::sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true)
                .journal_mode(idem::sqlx::sqlite::SqliteJournalMode::Wal)
                .busy_timeout(std::time::Duration::from_secs(5)),
        )
        .await?;
    idem::sqlx::query("CREATE TABLE IF NOT EXISTS ledger (txn INTEGER PRIMARY KEY, order_no TEXT NOT NULL, amount_cents INTEGER NOT NULL)")
        .execute(&ledger)
        .await?;
    let records_on = store.url().to_owned();
    idem::register_store("sqlite", store);
    let before = idem::metrics::counts_for("PAY");
    println!("idem quickstart: records on {records_on}, ledger in {path}\n");
    println!(
        "{:<34} {:<12} {:<28} executions",
        "step", "outcome", "answer"
    );

    let show = |step: &str,
                res: &Result<Receipt, PayError>,
                report: Option<&idem::metrics::CallReport>,
                execs: i64| {
        let (outcome, answer) = describe(res, report);
        println!("{step:<34} {outcome:<12} {answer:<28} {execs}");
    };

    // 1. First call executes; 2. a repeat replays the stored receipt.
    let order = PayReq {
        order_no: "ORD-1001".into(),
        amount_cents: 4_200,
    };
    for step in ["1. pay ORD-1001", "2. repeat ORD-1001"] {
        let (res, report) = idem::metrics::observe(pay(&ledger, &order)).await;
        show(
            step,
            &res,
            report.as_ref(),
            executions(&ledger, &order.order_no).await,
        );
    }

    // 3. Sixteen duplicates at once (a retry storm): the business runs once.
    let storm = PayReq {
        order_no: "ORD-1002".into(),
        amount_cents: 990,
    };
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (ledger, storm, barrier) = (ledger.clone(), storm.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                idem::metrics::observe(pay(&ledger, &storm)).await
            })
        })
        .collect();
    let mut tally = std::collections::BTreeMap::<&str, usize>::new();
    for t in tasks {
        let (_, report) = t.await?;
        *tally
            .entry(report.map_or("-", |r| r.outcome.as_str()))
            .or_default() += 1;
    }
    let tally: Vec<String> = tally.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!(
        "{:<34} {:<41} {}",
        "3. 16 concurrent ORD-1002",
        tally.join(" "),
        executions(&ledger, &storm.order_no).await
    );

    // 4. Same order number, another amount: refused (HTTP 422), nothing runs.
    let tampered = PayReq {
        amount_cents: 1,
        ..order.clone()
    };
    let (res, report) = idem::metrics::observe(pay(&ledger, &tampered)).await;
    show(
        "4. ORD-1001 with another amount",
        &res,
        report.as_ref(),
        executions(&ledger, &order.order_no).await,
    );

    // 5. The gateway fails; the record is FAILED, so the retry runs and succeeds.
    let flaky = PayReq {
        order_no: "ORD-1003".into(),
        amount_cents: 15_000,
    };
    GATEWAY_DOWN.store(true, Ordering::SeqCst);
    let (res, report) = idem::metrics::observe(pay(&ledger, &flaky)).await;
    show(
        "5a. pay ORD-1003 (gateway down)",
        &res,
        report.as_ref(),
        executions(&ledger, &flaky.order_no).await,
    );
    GATEWAY_DOWN.store(false, Ordering::SeqCst);
    let (res, report) = idem::metrics::observe(pay(&ledger, &flaky)).await;
    show(
        "5b. retry ORD-1003",
        &res,
        report.as_ref(),
        executions(&ledger, &flaky.order_no).await,
    );

    let c = idem::metrics::counts_for("PAY").since(&before);
    println!("\ncounters for PAY (this run):");
    for o in idem::metrics::Outcome::ALL {
        if c.get(o) > 0 {
            println!("  {:<12} {}", o.as_str(), c.get(o));
        }
    }
    println!(
        "  duplicate rate {:.0}% of {} calls",
        c.duplicate_rate() * 100.0,
        c.total()
    );
    println!("\nrun it again: every order replays from {path}");
    Ok(())
}
