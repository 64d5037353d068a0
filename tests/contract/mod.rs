//! The store contract: every backend runs this same suite (see `contract_suite!` at the bottom).
//!
//! Side effects are counted in an independent SQLite table (`effects`), never with idem's own
//! counters, so "executed once" is proven by what the business actually did.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem::sqlx::sqlite::SqlitePoolOptions;
use idem::sqlx::{self, SqlitePool};
use idem::{Call, ClaimOutcome, ClaimRequest, IdemError, Status, Store};
use serde::{Deserialize, Serialize};
use tokio::sync::Barrier;

/// A business type unique to this test run, so suites can share one server-side table.
pub fn biz(case: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
        % 1_000_000_000;
    let mut b = format!("{case}_{stamp}_{n}");
    b.truncate(32);
    b
}

/// An independent record of business side effects.
#[derive(Clone)]
pub struct Effects(SqlitePool);

impl Effects {
    pub async fn new() -> Self {
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        sqlx::query("CREATE TABLE effects (biz TEXT NOT NULL, k TEXT NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        Effects(pool)
    }

    pub async fn record(&self, biz: &str, key: &str) {
        sqlx::query("INSERT INTO effects (biz, k) VALUES (?1, ?2)")
            .bind(biz)
            .bind(key)
            .execute(&self.0)
            .await
            .unwrap();
    }

    pub async fn count(&self, biz: &str, key: &str) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM effects WHERE biz = ?1 AND k = ?2")
            .bind(biz)
            .bind(key)
            .fetch_one(&self.0)
            .await
            .unwrap()
    }

    /// (distinct keys, total rows) for one business type.
    pub async fn totals(&self, biz: &str) -> (i64, i64) {
        sqlx::query_as("SELECT COUNT(DISTINCT k), COUNT(*) FROM effects WHERE biz = ?1")
            .bind(biz)
            .fetch_one(&self.0)
            .await
            .unwrap()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub order: String,
    pub amount: u64,
    pub serial: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum PayError {
    #[error("declined")]
    Declined,
    #[error(transparent)]
    Idem(#[from] IdemError),
}

static SERIAL: AtomicU32 = AtomicU32::new(0);

/// The business: records its side effect and issues a receipt with a fresh serial number, so a
/// replay is distinguishable from a second execution.
pub async fn pay(
    effects: &Effects,
    biz: &str,
    order: &str,
    amount: u64,
) -> Result<Receipt, PayError> {
    effects.record(biz, order).await;
    Ok(Receipt {
        order: order.to_owned(),
        amount,
        serial: SERIAL.fetch_add(1, Ordering::Relaxed),
    })
}

/// Waits (bounded) until a record for `(biz, key)` exists: the call under test holds its claim.
async fn wait_for_record(store: &dyn Store, biz: &str, key: &str) {
    for _ in 0..500 {
        if store.load(biz, key).await.unwrap().is_some() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no record for ({biz}, {key}) after 5 s");
}

fn call(biz: &str, key: &str) -> Call {
    Call::new(biz.to_owned(), key).lease(Duration::from_secs(30))
}

fn req<'a>(biz: &'a str, key: &'a str, lease: Duration) -> ClaimRequest<'a> {
    ClaimRequest {
        biz,
        key,
        fingerprint: None,
        lease,
        ttl: Duration::from_secs(3600),
    }
}

// ---- the decision table -------------------------------------------------------------------

pub async fn fresh_key_runs_once_then_replays(store: Arc<dyn Store>) {
    let (fx, biz) = (Effects::new().await, biz("fresh"));
    let first = call(&biz, "o-1")
        .run(&*store, pay(&fx, &biz, "o-1", 100))
        .await
        .unwrap();
    let again = call(&biz, "o-1")
        .run(&*store, pay(&fx, &biz, "o-1", 100))
        .await
        .unwrap();
    assert_eq!(first, again, "a repeat must get the first answer");
    assert_eq!(fx.count(&biz, "o-1").await, 1);
    let rec = store
        .load(&biz, "o-1")
        .await
        .unwrap()
        .expect("record written");
    assert_eq!((rec.status, rec.attempt), (Status::Succeeded, 1));
    assert!(rec.snapshot.is_some());
}

pub async fn same_key_other_biz_is_another_record(store: Arc<dyn Store>) {
    let (fx, a, b) = (Effects::new().await, biz("dom_a"), biz("dom_b"));
    call(&a, "k")
        .run(&*store, pay(&fx, &a, "k", 1))
        .await
        .unwrap();
    call(&b, "k")
        .run(&*store, pay(&fx, &b, "k", 1))
        .await
        .unwrap();
    assert_eq!((fx.count(&a, "k").await, fx.count(&b, "k").await), (1, 1));
}

pub async fn succeeded_with_other_payload_is_a_mismatch(store: Arc<dyn Store>) {
    let (fx, biz) = (Effects::new().await, biz("mismatch"));
    call(&biz, "o")
        .fingerprint(&("o", 100))
        .run(&*store, pay(&fx, &biz, "o", 100))
        .await
        .unwrap();
    let other = call(&biz, "o")
        .fingerprint(&("o", 999))
        .run(&*store, pay(&fx, &biz, "o", 999))
        .await;
    assert!(
        matches!(other, Err(PayError::Idem(IdemError::PayloadMismatch))),
        "{other:?}"
    );
    let same = call(&biz, "o")
        .fingerprint(&("o", 100))
        .run(&*store, pay(&fx, &biz, "o", 100))
        .await
        .unwrap();
    assert_eq!(same.amount, 100);
    assert_eq!(fx.count(&biz, "o").await, 1);
}

pub async fn processing_with_valid_lease_is_in_progress(store: Arc<dyn Store>) {
    let (fx, biz) = (Effects::new().await, biz("inprog"));
    let held = store
        .claim(&req(&biz, "o", Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(
        matches!(held, ClaimOutcome::Acquired { attempt: 1, .. }),
        "{held:?}"
    );
    let dup = call(&biz, "o").run(&*store, pay(&fx, &biz, "o", 1)).await;
    match dup {
        Err(PayError::Idem(IdemError::InProgress { retry_after })) => {
            assert!(
                retry_after <= Duration::from_secs(30) && retry_after > Duration::from_secs(20),
                "{retry_after:?}"
            )
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
    assert_eq!(fx.count(&biz, "o").await, 0);
}

pub async fn processing_with_other_payload_is_a_mismatch(store: Arc<dyn Store>) {
    let (fx, biz) = (Effects::new().await, biz("inprog_fp"));
    let mut r = req(&biz, "o", Duration::from_secs(30));
    r.fingerprint = Some("aaaa");
    store.claim(&r).await.unwrap();
    let dup = call(&biz, "o")
        .fingerprint("other")
        .run(&*store, pay(&fx, &biz, "o", 1))
        .await;
    assert!(
        matches!(dup, Err(PayError::Idem(IdemError::PayloadMismatch))),
        "{dup:?}"
    );
}

pub async fn expired_lease_is_taken_over_and_the_late_finisher_is_fenced(store: Arc<dyn Store>) {
    let (fx, biz) = (Effects::new().await, biz("takeover"));
    let lease = Duration::from_millis(150);
    let ClaimOutcome::Acquired { attempt: stale, .. } =
        store.claim(&req(&biz, "o", lease)).await.unwrap()
    else {
        panic!("first claim must be acquired")
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (res, report) = idem::observe(
        call(&biz, "o")
            .lease(lease)
            .ttl(Duration::from_secs(60))
            .run(&*store, pay(&fx, &biz, "o", 7)),
    )
    .await;
    let fresh = res.unwrap();
    let report = report.expect("a report");
    assert_eq!(
        (report.outcome, report.attempt),
        (idem::Outcome::TakenOver, stale + 1)
    );
    // The stale attempt wakes up and tries to mark: it must be refused and change nothing.
    let late = store
        .complete(&biz, "o", stale, b"{\"Ok\":\"stale\"}".to_vec())
        .await;
    assert!(
        matches!(late, Err(IdemError::LeaseLost { attempt }) if attempt == stale),
        "{late:?}"
    );
    let late_fail = store.fail(&biz, "o", stale).await;
    assert!(
        matches!(late_fail, Err(IdemError::LeaseLost { .. })),
        "{late_fail:?}"
    );
    let rec = store.load(&biz, "o").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.attempt), (Status::Succeeded, stale + 1));
    let replay = call(&biz, "o")
        .run(&*store, pay(&fx, &biz, "o", 7))
        .await
        .unwrap();
    assert_eq!(replay, fresh);
    assert_eq!(fx.count(&biz, "o").await, 1);
}

pub async fn failure_allows_a_retry(store: Arc<dyn Store>) {
    let (fx, biz) = (Effects::new().await, biz("retry"));
    let failed: Result<Receipt, PayError> = call(&biz, "o")
        .run(&*store, async { Err(PayError::Declined) })
        .await;
    assert!(matches!(failed, Err(PayError::Declined)));
    let rec = store.load(&biz, "o").await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.attempt, rec.snapshot.is_none()),
        (Status::Failed, 1, true)
    );
    let (ok, report) = idem::observe(call(&biz, "o").run(&*store, pay(&fx, &biz, "o", 5))).await;
    assert_eq!(ok.unwrap().amount, 5);
    assert_eq!(report.unwrap().attempt, 2);
    assert_eq!(
        store.load(&biz, "o").await.unwrap().unwrap().status,
        Status::Succeeded
    );
    assert_eq!(fx.count(&biz, "o").await, 1);
}

pub async fn expired_record_counts_as_absent_and_is_swept(store: Arc<dyn Store>) {
    let (fx, biz) = (Effects::new().await, biz("ttl"));
    let short = |k: &str| {
        call(&biz, k)
            .lease(Duration::from_millis(100))
            .ttl(Duration::from_millis(300))
    };
    short("a")
        .run(&*store, pay(&fx, &biz, "a", 1))
        .await
        .unwrap();
    short("b")
        .run(&*store, pay(&fx, &biz, "b", 1))
        .await
        .unwrap();
    call(&biz, "kept")
        .run(&*store, pay(&fx, &biz, "kept", 1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Expired: runs again as a fresh record (with a long TTL, so a slow machine cannot let it
    // expire again before the sweep below).
    call(&biz, "a")
        .run(&*store, pay(&fx, &biz, "a", 1))
        .await
        .unwrap();
    assert_eq!(fx.count(&biz, "a").await, 2);
    // The sweeper deletes `b` (expired) but neither the renewed `a` nor `kept`.
    let swept = idem::Sweeper::new(store.clone(), 1)
        .sweep_once()
        .await
        .unwrap();
    assert!(swept >= 1, "swept {swept}");
    assert!(store.load(&biz, "b").await.unwrap().is_none());
    assert!(store.load(&biz, "a").await.unwrap().is_some());
    assert!(store.load(&biz, "kept").await.unwrap().is_some());
}

pub async fn waiting_duplicate_gets_the_first_answer(store: Arc<dyn Store>) {
    let (fx, biz) = (Effects::new().await, biz("wait"));
    let slow = {
        let (store, fx, biz) = (store.clone(), fx.clone(), biz.clone());
        tokio::spawn(async move {
            call(&biz, "o")
                .run(&*store, async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    pay(&fx, &biz, "o", 3).await
                })
                .await
        })
    };
    wait_for_record(&*store, &biz, "o").await;
    let waited = call(&biz, "o")
        .wait(Duration::from_secs(5))
        .run(&*store, pay(&fx, &biz, "o", 3))
        .await
        .unwrap();
    let first = slow.await.unwrap().unwrap();
    assert_eq!(waited, first);
    assert_eq!(fx.count(&biz, "o").await, 1);
    // A wait shorter than the work gives up with InProgress.
    let holder = store
        .claim(&req(&biz, "p", Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(matches!(holder, ClaimOutcome::Acquired { .. }));
    let gave_up = call(&biz, "p")
        .wait(Duration::from_millis(100))
        .run(&*store, pay(&fx, &biz, "p", 3))
        .await;
    assert!(
        matches!(gave_up, Err(PayError::Idem(IdemError::InProgress { .. }))),
        "{gave_up:?}"
    );
}

// ---- failures inside the body ---------------------------------------------------------------

pub async fn panic_in_body_never_claims_success(store: Arc<dyn Store>) {
    let (fx, biz) = (Effects::new().await, biz("panic"));
    let lease = Duration::from_millis(150);
    let task = {
        let (store, biz) = (store.clone(), biz.clone());
        tokio::spawn(async move {
            let _: Result<Receipt, PayError> = call(&biz, "o")
                .lease(lease)
                .run(&*store, async { panic!("business blew up") })
                .await;
        })
    };
    assert!(task.await.unwrap_err().is_panic());
    let rec = store.load(&biz, "o").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.snapshot), (Status::Processing, None));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let retried = call(&biz, "o")
        .lease(lease)
        .run(&*store, pay(&fx, &biz, "o", 9))
        .await
        .unwrap();
    assert_eq!(retried.amount, 9);
    assert_eq!(fx.count(&biz, "o").await, 1);
}

pub async fn dropped_future_never_claims_success(store: Arc<dyn Store>) {
    let (fx, biz) = (Effects::new().await, biz("drop"));
    let lease = Duration::from_millis(150);
    let running = {
        let (store, fx, biz) = (store.clone(), fx.clone(), biz.clone());
        tokio::spawn(async move {
            call(&biz, "o")
                .lease(lease)
                .run(&*store, async {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    pay(&fx, &biz, "o", 1).await
                })
                .await
        })
    };
    // Cancel the call once it holds the claim (the future is dropped mid-body).
    wait_for_record(&*store, &biz, "o").await;
    running.abort();
    assert!(
        running.await.unwrap_err().is_cancelled(),
        "the call must have been cancelled"
    );
    let rec = store.load(&biz, "o").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.snapshot), (Status::Processing, None));
    tokio::time::sleep(Duration::from_millis(300)).await;
    call(&biz, "o")
        .lease(lease)
        .run(&*store, pay(&fx, &biz, "o", 1))
        .await
        .unwrap();
    assert_eq!(fx.count(&biz, "o").await, 1);
}

// ---- bad input ------------------------------------------------------------------------------

pub async fn bad_keys_are_refused_before_anything_is_written(store: Arc<dyn Store>) {
    let (fx, biz) = (Effects::new().await, biz("badkey"));
    let long = "k".repeat(129);
    for (key, why) in [
        ("", "empty"),
        ("  \t ", "whitespace"),
        (long.as_str(), "too long"),
        ("a\0b", "NUL"),
    ] {
        let res = call(&biz, key).run(&*store, pay(&fx, &biz, key, 1)).await;
        assert!(
            matches!(res, Err(PayError::Idem(IdemError::InvalidKey { .. }))),
            "{why}: {res:?}"
        );
        assert!(
            store.load(&biz, key).await.unwrap().is_none(),
            "{why}: nothing may be written"
        );
    }
    let (d, total) = fx.totals(&biz).await;
    assert_eq!((d, total), (0, 0), "no business may run for a refused key");
    // Hostile but valid keys are stored verbatim and bound, never spliced into SQL.
    for key in [
        "'; DROP TABLE idem_record; --",
        "\"quoted\" `key`",
        "订单-🦀-🎉",
        &"k".repeat(128),
    ] {
        let first = call(&biz, key)
            .run(&*store, pay(&fx, &biz, key, 1))
            .await
            .unwrap();
        let again = call(&biz, key)
            .run(&*store, pay(&fx, &biz, key, 1))
            .await
            .unwrap();
        assert_eq!(first, again);
        assert_eq!(store.load(&biz, key).await.unwrap().unwrap().key, key);
        assert_eq!(fx.count(&biz, key).await, 1, "{key}");
    }
}

pub async fn bad_biz_is_refused(store: Arc<dyn Store>) {
    let fx = Effects::new().await;
    for b in ["", "has space", &"B".repeat(store.limits().max_biz_len + 1)] {
        let res = Call::new(b.to_owned(), "k")
            .run(&*store, pay(&fx, b, "k", 1))
            .await;
        assert!(
            matches!(res, Err(PayError::Idem(IdemError::InvalidBiz { .. }))),
            "{b:?}: {res:?}"
        );
        assert_eq!(fx.totals(b).await.1, 0);
    }
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct Unserializable(std::collections::HashMap<(u8, u8), u8>);

pub async fn unstorable_results_keep_the_claim(store: Arc<dyn Store>) {
    let (fx, biz) = (Effects::new().await, biz("unstorable"));
    // Over the snapshot limit.
    let big = "x".repeat(store.limits().max_snapshot_len + 1);
    for _ in 0..2 {
        let res: Result<String, PayError> = call(&biz, "big")
            .run(&*store, async {
                fx.record(&biz, "big").await;
                Ok(big.clone())
            })
            .await;
        assert!(
            matches!(
                res,
                Err(PayError::Idem(IdemError::ResultNotStorable { .. }))
            ),
            "{res:?}"
        );
    }
    assert_eq!(
        fx.count(&biz, "big").await,
        1,
        "the business ran once and must not run again"
    );
    assert_eq!(
        store.load(&biz, "big").await.unwrap().unwrap().status,
        Status::Succeeded
    );
    // Fails to serialize (a JSON map needs string keys).
    for _ in 0..2 {
        let res: Result<Unserializable, PayError> = call(&biz, "ser")
            .run(&*store, async {
                fx.record(&biz, "ser").await;
                Ok(Unserializable([((1, 2), 3)].into()))
            })
            .await;
        assert!(
            matches!(
                res,
                Err(PayError::Idem(IdemError::ResultNotStorable { .. }))
            ),
            "{res:?}"
        );
    }
    assert_eq!(fx.count(&biz, "ser").await, 1);
}

pub async fn unfingerprintable_payload_is_refused(store: Arc<dyn Store>) {
    let (fx, biz) = (Effects::new().await, biz("badfp"));
    let payload = Unserializable([((1, 2), 3)].into());
    let res = call(&biz, "o")
        .fingerprint(&payload)
        .run(&*store, pay(&fx, &biz, "o", 1))
        .await;
    assert!(
        matches!(res, Err(PayError::Idem(IdemError::Fingerprint { .. }))),
        "{res:?}"
    );
    assert!(store.load(&biz, "o").await.unwrap().is_none());
}

// ---- the retry storm ------------------------------------------------------------------------

/// `keys` keys × `callers` same-key callers, all released at once by a barrier, waiting for each
/// other: every key's business runs exactly once and every caller gets that one answer.
pub async fn burst_executes_each_key_once(store: Arc<dyn Store>, keys: usize, callers: usize) {
    let (fx, biz) = (Effects::new().await, biz("burst"));
    let barrier = Arc::new(Barrier::new(keys * callers));
    let mut tasks = Vec::with_capacity(keys * callers);
    for k in 0..keys {
        for _ in 0..callers {
            let (store, fx, biz, barrier) =
                (store.clone(), fx.clone(), biz.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let key = format!("order-{k}");
                barrier.wait().await;
                let res = call(&biz, &key)
                    .fingerprint(&key)
                    .wait(Duration::from_secs(60))
                    .run(&*store, pay(&fx, &biz, &key, k as u64))
                    .await;
                (k, res)
            }));
        }
    }
    let mut answers: Vec<Option<Receipt>> = vec![None; keys];
    for t in tasks {
        let (k, res) = t.await.unwrap();
        let receipt = res.unwrap_or_else(|e| panic!("key {k}: {e:?}"));
        match &answers[k] {
            None => answers[k] = Some(receipt),
            Some(first) => assert_eq!(
                first, &receipt,
                "key {k}: every caller must get the first answer"
            ),
        }
    }
    let (distinct, total) = fx.totals(&biz).await;
    assert_eq!(
        (distinct, total),
        (keys as i64, keys as i64),
        "executions must equal keys"
    );
}

/// Generates one `#[tokio::test]` per contract case for a backend. `$make` is an async
/// expression giving `Option<Arc<dyn Store>>` (None: the backend's server is unreachable and the
/// suite is skipped with one line, unless IDEM_REQUIRE_SERVICES=1).
#[macro_export]
macro_rules! contract_suite {
    ($make:expr, burst = ($keys:expr, $callers:expr)) => {
        $crate::contract_suite!(@cases $make;
            fresh_key_runs_once_then_replays,
            same_key_other_biz_is_another_record,
            succeeded_with_other_payload_is_a_mismatch,
            processing_with_valid_lease_is_in_progress,
            processing_with_other_payload_is_a_mismatch,
            expired_lease_is_taken_over_and_the_late_finisher_is_fenced,
            failure_allows_a_retry,
            expired_record_counts_as_absent_and_is_swept,
            waiting_duplicate_gets_the_first_answer,
            panic_in_body_never_claims_success,
            dropped_future_never_claims_success,
            bad_keys_are_refused_before_anything_is_written,
            bad_biz_is_refused,
            unstorable_results_keep_the_claim,
            unfingerprintable_payload_is_refused,
        );
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn burst_executes_each_key_once() {
            if let Some(store) = $make.await {
                contract::burst_executes_each_key_once(store, $keys, $callers).await;
            }
        }
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            if let Some(store) = $make.await {
                contract::$case(store).await;
            }
        }
    )*};
}
