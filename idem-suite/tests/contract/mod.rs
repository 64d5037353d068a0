//! The store contract: every backend runs this same suite (see `contract_suite!` at the bottom),
//! and every backend with transactions runs `tx.rs` too.
//!
//! Side effects are counted in an independent SQLite table (`effects`), never with idem's own
//! counters, so "executed once" is proven by what the business actually did. Lease and TTL edges
//! are driven by a `TestClock` handed to the store, never by sleeps a loaded machine can reorder.

#![allow(dead_code)]

pub mod admin;
pub mod edges;
pub mod pool;
pub mod reconcile;
pub mod recover;
pub mod result_ttl;
pub mod server;
pub mod steps;
#[macro_use]
pub mod tokens;
#[macro_use]
pub mod tx;

// The suites' macros name every case as `contract::<case>`; binaries that only use `tokens` or `tx`
// name none of these.
#[allow(unused_imports)]
pub use admin::{
    a_release_racing_a_takeover_has_one_winner,
    mark_failed_moves_an_ended_lease_to_failed_and_the_next_call_runs,
    release_ends_the_lease_and_the_retry_recovers_the_effect,
    release_refuses_a_success_a_live_lease_an_absent_key_and_a_bad_reason,
    stats_count_layer_records_per_route, stats_count_records_per_biz_and_status,
    stuck_all_lists_ended_leases_across_business_types,
};
#[allow(unused_imports)]
pub use edges::{
    a_store_clamps_durations_it_is_handed, distinct_pairs_are_distinct_records,
    durations_at_the_limits,
};
#[allow(unused_imports)]
pub use reconcile::{
    a_takeover_racing_the_reconciler_has_one_winner, stuck_lists_ended_leases_oldest_first,
    the_reconciler_resolves_stuck_records_in_batches,
};
#[allow(unused_imports)]
pub use recover::{
    a_failed_recover_releases_the_claim, a_takeover_asks_recover_before_running_the_body,
    recover_is_not_asked_for_a_fresh_claim_or_a_retry,
};
#[allow(unused_imports)]
pub use result_ttl::{
    a_repeat_after_its_result_ttl_is_refused_until_the_ttl_ends,
    a_result_ttl_is_checked_and_the_default_keeps_the_result,
};
#[allow(unused_imports)]
pub use steps::{
    a_new_life_or_another_payload_starts_without_steps,
    a_retry_after_a_failure_resumes_after_the_saved_steps,
    a_takeover_runs_only_the_steps_not_saved,
    saved_steps_are_fenced_and_outlive_takeovers_and_failures, steps_are_refused_with_clear_errors,
};

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem::sqlx::sqlite::SqlitePoolOptions;
use idem::sqlx::{self, SqlitePool};
use idem::{
    Acquired, Call, Claim, ClaimOutcome, ClaimRequest, IdemError, Status, Store, TestClock,
};
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
        ttl: TTL,
    }
}

/// The ttl of [`req`]'s claims.
pub const TTL: Duration = Duration::from_secs(3600);

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A store under test and the clock it reads.
pub struct Subject {
    pub store: Arc<dyn Store>,
    pub clock: TestClock,
}

/// Claims and expects to hold the claim.
async fn acquire(store: &dyn Store, r: &ClaimRequest<'_>) -> (Claim, Acquired) {
    match store.claim(r).await.unwrap() {
        ClaimOutcome::Acquired { claim, how } => (claim, how),
        other => panic!("expected to acquire ({}, {}), got {other:?}", r.biz, r.key),
    }
}

/// Turns `store` to reading first: a SQL or Redis store sends a claim's plain read before its
/// write once most of its recent claims met a record. One key run once, then repeated 24 times,
/// turns it from any state.
pub async fn turned_to_read_first(store: &dyn Store) -> &dyn Store {
    let biz = biz("warm");
    for _ in 0..25 {
        let done: Result<u32, IdemError> = Call::new(biz.clone(), "warm")
            .run(store, async { Ok(7) })
            .await;
        assert_eq!(done.unwrap(), 7);
    }
    store
}

/// `store` after 25 first executions on new keys: its claims insert first again (the opposite of
/// [`turned_to_read_first`]).
pub async fn turned_to_write_first(store: &dyn Store) -> &dyn Store {
    let biz = biz("warm_new");
    for i in 0..25u32 {
        let done: Result<u32, IdemError> = Call::new(biz.clone(), &i)
            .run(store, async move { Ok(i) })
            .await;
        assert_eq!(done.unwrap(), i);
    }
    store
}

/// The decision table once claims read first: every case gives what it gives written first.
pub async fn the_decision_table_holds_when_claims_read_first(s: Subject) {
    let again = |s: &Subject| Subject {
        store: s.store.clone(),
        clock: s.clock.clone(),
    };
    macro_rules! read_first {
        ($($case:ident),*) => {$(
            turned_to_read_first(&*s.store).await;
            $case(again(&s)).await;
        )*};
    }
    read_first!(
        fresh_key_runs_once_then_replays,
        succeeded_with_other_payload_is_a_mismatch,
        processing_with_valid_lease_is_in_progress,
        processing_with_other_payload_is_a_mismatch,
        expired_lease_is_taken_over_and_the_late_finisher_is_fenced,
        failure_allows_a_retry,
        expired_record_counts_as_absent_and_is_swept,
        waiting_duplicate_gets_the_first_answer,
        a_live_lease_outlives_the_ttl,
        a_success_outlives_a_body_slower_than_its_ttl,
        a_takeover_racing_a_late_complete_has_one_winner,
        a_contended_takeover_runs_the_business_once,
        a_burst_with_failing_bodies_executes_each_key_once,
        a_repeat_after_its_result_ttl_is_refused_until_the_ttl_ends
    );
    turned_to_read_first(&*s.store).await;
    burst_executes_each_key_once(again(&s), 8, 16).await;
}

// ---- the decision table -------------------------------------------------------------------

pub async fn fresh_key_runs_once_then_replays(s: Subject) {
    let (store, fx, biz) = (s.store, Effects::new().await, biz("fresh"));
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
    assert!(rec.fence.get() > 0, "a fence is issued");
    assert!(rec.snapshot.is_some());
}

pub async fn same_key_other_biz_is_another_record(s: Subject) {
    let (store, fx, a, b) = (s.store, Effects::new().await, biz("dom_a"), biz("dom_b"));
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

pub async fn succeeded_with_other_payload_is_a_mismatch(s: Subject) {
    let (store, fx, biz) = (s.store, Effects::new().await, biz("mismatch"));
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

/// A fingerprint may carry where its request came from before its digest (the HTTP layer keeps
/// `POST /orders/{id} <digest>`): the store compares digests, so a record written with the digest
/// alone (by an earlier version) is the same request as one with its route, and another digest
/// under the same route is still another request.
pub async fn fingerprints_compare_by_their_digest(s: Subject) {
    let (store, biz) = (s.store, biz("fp_origin"));
    let mut plain = req(&biz, "o", secs(30));
    plain.fingerprint = Some("d1");
    let (held, _) = acquire(&*store, &plain).await;
    let mut routed = req(&biz, "o", secs(30));
    routed.fingerprint = Some("POST /orders/{id} d1");
    assert!(
        matches!(
            store.claim(&routed).await.unwrap(),
            ClaimOutcome::InProgress { .. }
        ),
        "the same digest under a route is the same request, still running"
    );
    store
        .complete(&biz, "o", &held, b"first", secs(60))
        .await
        .unwrap();
    match store.claim(&routed).await.unwrap() {
        ClaimOutcome::Replay { snapshot } => assert_eq!(snapshot, b"first"),
        other => panic!("expected the replay, got {other:?}"),
    }
    let mut other = req(&biz, "o", secs(30));
    other.fingerprint = Some("POST /orders/{id} d2");
    assert!(
        matches!(store.claim(&other).await.unwrap(), ClaimOutcome::Mismatch),
        "another digest on the same route is another request"
    );
}

pub async fn processing_with_valid_lease_is_in_progress(s: Subject) {
    let (store, fx, biz) = (s.store, Effects::new().await, biz("inprog"));
    let (held, how) = acquire(&*store, &req(&biz, "o", secs(30))).await;
    assert_eq!((held.attempt, how), (1, Acquired::Fresh));
    let dup = call(&biz, "o").run(&*store, pay(&fx, &biz, "o", 1)).await;
    match dup {
        Err(PayError::Idem(IdemError::InProgress { retry_after })) => {
            assert!(
                retry_after <= secs(30) && retry_after > secs(20),
                "{retry_after:?}"
            )
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
    assert_eq!(fx.count(&biz, "o").await, 0);
}

pub async fn processing_with_other_payload_is_a_mismatch(s: Subject) {
    let (store, fx, biz) = (s.store, Effects::new().await, biz("inprog_fp"));
    let mut r = req(&biz, "o", secs(30));
    r.fingerprint = Some("aaaa");
    acquire(&*store, &r).await;
    let dup = call(&biz, "o")
        .fingerprint("other")
        .run(&*store, pay(&fx, &biz, "o", 1))
        .await;
    assert!(
        matches!(dup, Err(PayError::Idem(IdemError::PayloadMismatch))),
        "{dup:?}"
    );
}

pub async fn expired_lease_is_taken_over_and_the_late_finisher_is_fenced(s: Subject) {
    let (store, clock, fx, biz) = (s.store, s.clock, Effects::new().await, biz("takeover"));
    let (stale, _) = acquire(&*store, &req(&biz, "o", secs(10))).await;
    clock.advance(secs(11));
    let (res, report) = idem::metrics::observe(
        call(&biz, "o")
            .lease(secs(10))
            .ttl(secs(60))
            .run(&*store, pay(&fx, &biz, "o", 7)),
    )
    .await;
    let fresh = res.unwrap();
    let report = report.expect("a report");
    assert_eq!(
        (report.outcome, report.attempt),
        (idem::metrics::Outcome::TakenOver, stale.attempt + 1)
    );
    // The stale attempt wakes up and tries to mark: it must be refused and change nothing.
    let late = store
        .complete(&biz, "o", &stale, b"{\"Ok\":\"stale\"}", TTL)
        .await;
    assert!(
        matches!(late, Err(IdemError::LeaseLost { attempt }) if attempt == stale.attempt),
        "{late:?}"
    );
    let late_fail = store.fail(&biz, "o", &stale).await;
    assert!(
        matches!(late_fail, Err(IdemError::LeaseLost { .. })),
        "{late_fail:?}"
    );
    let late_renew = store.renew(&biz, "o", &stale, secs(10)).await;
    assert!(
        matches!(late_renew, Err(IdemError::LeaseLost { .. })),
        "{late_renew:?}"
    );
    let rec = store.load(&biz, "o").await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.attempt),
        (Status::Succeeded, stale.attempt + 1)
    );
    assert!(rec.fence > stale.fence, "the takeover's fence is larger");
    let replay = call(&biz, "o")
        .run(&*store, pay(&fx, &biz, "o", 7))
        .await
        .unwrap();
    assert_eq!(replay, fresh);
    assert_eq!(fx.count(&biz, "o").await, 1);
}

pub async fn failure_allows_a_retry(s: Subject) {
    let (store, fx, biz) = (s.store, Effects::new().await, biz("retry"));
    let failed: Result<Receipt, PayError> = call(&biz, "o")
        .run(&*store, async { Err(PayError::Declined) })
        .await;
    assert!(matches!(failed, Err(PayError::Declined)));
    let rec = store.load(&biz, "o").await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.attempt, rec.snapshot.is_none()),
        (Status::Failed, 1, true)
    );
    let (ok, report) =
        idem::metrics::observe(call(&biz, "o").run(&*store, pay(&fx, &biz, "o", 5))).await;
    assert_eq!(ok.unwrap().amount, 5);
    assert_eq!(report.unwrap().attempt, 2);
    let rec2 = store.load(&biz, "o").await.unwrap().unwrap();
    assert_eq!(rec2.status, Status::Succeeded);
    assert!(rec2.fence > rec.fence, "a retry gets a new fence");
    assert_eq!(fx.count(&biz, "o").await, 1);
}

pub async fn expired_record_counts_as_absent_and_is_swept(s: Subject) {
    let (store, clock, fx, biz) = (s.store, s.clock, Effects::new().await, biz("ttl"));
    let short = |k: &str| call(&biz, k).lease(secs(10)).ttl(secs(30));
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
    let old_a = store.load(&biz, "a").await.unwrap().unwrap();
    clock.advance(secs(31));
    // Expired: runs again as a fresh record (attempt 1, a larger fence).
    call(&biz, "a")
        .run(&*store, pay(&fx, &biz, "a", 1))
        .await
        .unwrap();
    assert_eq!(fx.count(&biz, "a").await, 2);
    let new_a = store.load(&biz, "a").await.unwrap().unwrap();
    assert_eq!(new_a.attempt, 1, "an expired record starts a new life");
    assert!(new_a.fence > old_a.fence, "but never reuses a fence");
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

pub async fn waiting_duplicate_gets_the_first_answer(s: Subject) {
    let (store, fx, biz) = (s.store, Effects::new().await, biz("wait"));
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
        .wait(secs(5))
        .run(&*store, pay(&fx, &biz, "o", 3))
        .await
        .unwrap();
    let first = slow.await.unwrap().unwrap();
    assert_eq!(waited, first);
    assert_eq!(fx.count(&biz, "o").await, 1);
    // A wait shorter than the work gives up with InProgress.
    acquire(&*store, &req(&biz, "p", secs(30))).await;
    let gave_up = call(&biz, "p")
        .wait(Duration::from_millis(100))
        .run(&*store, pay(&fx, &biz, "p", 3))
        .await;
    assert!(
        matches!(gave_up, Err(PayError::Idem(IdemError::InProgress { .. }))),
        "{gave_up:?}"
    );
}

// ---- TTL, lease and fence edges ------------------------------------------------

/// Probe: ttl 30 s, lease 20 s; attempt 1 fails at t=0; a retry takes over at 25 s; a third
/// caller at 35 s (TTL passed, attempt 2's lease runs to 45 s) must be told "in progress", and the
/// sweeper must not delete the record. Before the fix the third caller got `Acquired` and two bodies
/// ran at once.
pub async fn a_live_lease_outlives_the_ttl(s: Subject) {
    let (store, clock, biz) = (s.store, s.clock, biz("lease_ttl"));
    let r = ClaimRequest {
        ttl: secs(30),
        ..req(&biz, "k", secs(20))
    };
    let (first, _) = acquire(&*store, &r).await;
    store.fail(&biz, "k", &first).await.unwrap();
    clock.advance(secs(25));
    let (second, how) = acquire(&*store, &r).await;
    assert_eq!((second.attempt, how), (2, Acquired::RetryAfterFailure));
    let rec = store.load(&biz, "k").await.unwrap().unwrap();
    assert!(
        rec.expire_at_ms >= rec.lease_until_ms,
        "a takeover extends the record to cover its lease: {rec:?}"
    );
    clock.advance(secs(10));
    let third = store.claim(&r).await.unwrap();
    assert!(
        matches!(third, ClaimOutcome::InProgress { .. }),
        "attempt 2 still holds its lease: {third:?}"
    );
    assert_eq!(
        idem::Sweeper::new(store.clone(), 100)
            .sweep_once()
            .await
            .unwrap(),
        0,
        "a live lease is never swept"
    );
    store
        .complete(&biz, "k", &second, b"{\"Ok\":1}", r.ttl)
        .await
        .expect("attempt 2 still holds the record");
}

/// Even a request whose lease is longer than its TTL (the store API allows it) is protected for
/// its whole lease, by claims and by the sweeper.
pub async fn a_sweep_spares_a_record_under_a_live_lease(s: Subject) {
    let (store, clock, biz) = (s.store, s.clock, biz("sweep_live"));
    let r = ClaimRequest {
        ttl: secs(10),
        ..req(&biz, "k", secs(60))
    };
    let (held, _) = acquire(&*store, &r).await;
    clock.advance(secs(30));
    let swept = idem::Sweeper::new(store.clone(), 100)
        .sweep_once()
        .await
        .unwrap();
    assert_eq!(swept, 0);
    assert!(matches!(
        store.claim(&r).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    store
        .complete(&biz, "k", &held, b"{\"Ok\":1}", r.ttl)
        .await
        .unwrap();
    clock.advance(secs(31));
    assert_eq!(
        idem::Sweeper::new(store.clone(), 100)
            .sweep_once()
            .await
            .unwrap(),
        1
    );
}

/// Probe: ttl 2 s, lease 1 s, a body that takes 3 s (on the test clock; no heartbeat). The mark
/// moves the record's expiry to at least completion + ttl, so the success is live and a repeat
/// replays; once that ttl has passed too, the record has expired and the next call runs again.
/// Before the fix the expiry stayed at claim + ttl: the new success was already expired and the
/// repeat ran the body again.
pub async fn a_success_outlives_a_body_slower_than_its_ttl(s: Subject) {
    let (store, clock, fx, biz) = (s.store, s.clock, Effects::new().await, biz("slow_body"));
    let slow = || {
        Call::new(biz.clone(), "k")
            .ttl(secs(2))
            .lease(secs(1))
            .no_heartbeat()
    };
    let first = slow()
        .run(&*store, async {
            clock.advance(secs(3));
            pay(&fx, &biz, "k", 1).await
        })
        .await
        .expect("the mark succeeds");
    assert_eq!(fx.count(&biz, "k").await, 1);
    let rec = store.load(&biz, "k").await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Succeeded);
    // The mark came at least 2 s after the lease end (3 s into a 1 s lease) and the record lives
    // the ttl (2 s) from it.
    assert!(
        rec.expire_at_ms >= rec.lease_until_ms + 4_000,
        "the success must live a ttl from its mark: {rec:?}"
    );
    let (again, report) = idem::metrics::observe(slow().run(&*store, pay(&fx, &biz, "k", 1))).await;
    assert_eq!(again.unwrap(), first, "a repeat gets the first answer");
    assert_eq!(report.unwrap().outcome, idem::metrics::Outcome::Replayed);
    assert_eq!(fx.count(&biz, "k").await, 1, "the body did not run again");
    clock.advance(secs(3));
    let (later, report) = idem::metrics::observe(slow().run(&*store, pay(&fx, &biz, "k", 1))).await;
    assert_ne!(later.unwrap(), first, "past its ttl the record has expired");
    assert_eq!(report.unwrap().outcome, idem::metrics::Outcome::Executed);
    assert_eq!(fx.count(&biz, "k").await, 2);
}

/// Probe: claim, let lease and TTL pass, sweep, claim again; the old holder's complete must be
/// refused (before the fix it returned `Ok` and stored its stale result in the new claim).
pub async fn a_fence_never_repeats_after_a_sweep(s: Subject) {
    let (store, clock, biz) = (s.store, s.clock, biz("fence_sweep"));
    let r = ClaimRequest {
        ttl: secs(20),
        ..req(&biz, "k", secs(10))
    };
    let (old, _) = acquire(&*store, &r).await;
    clock.advance(secs(21));
    assert_eq!(
        idem::Sweeper::new(store.clone(), 100)
            .sweep_once()
            .await
            .unwrap(),
        1
    );
    assert!(store.load(&biz, "k").await.unwrap().is_none());
    let (new, how) = acquire(&*store, &r).await;
    assert_eq!(
        (new.attempt, how),
        (1, Acquired::Fresh),
        "attempt counts restart"
    );
    assert!(
        new.fence > old.fence,
        "fences never repeat: {old:?} then {new:?}"
    );
    let stale = store
        .complete(&biz, "k", &old, b"{\"Ok\":\"stale\"}", r.ttl)
        .await;
    assert!(
        matches!(stale, Err(IdemError::LeaseLost { .. })),
        "{stale:?}"
    );
    let rec = store.load(&biz, "k").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.fence), (Status::Processing, new.fence));
    store
        .complete(&biz, "k", &new, b"{\"Ok\":\"new\"}", r.ttl)
        .await
        .unwrap();
}

/// A holder whose record was swept (it stalled past lease and TTL) gets `LeaseLost` and recreates
/// nothing.
pub async fn complete_after_a_sweep_is_lease_lost(s: Subject) {
    let (store, clock, biz) = (s.store, s.clock, biz("swept_complete"));
    let r = ClaimRequest {
        ttl: secs(20),
        ..req(&biz, "k", secs(10))
    };
    let (held, _) = acquire(&*store, &r).await;
    clock.advance(secs(21));
    idem::Sweeper::new(store.clone(), 100)
        .sweep_once()
        .await
        .unwrap();
    let late = store.complete(&biz, "k", &held, b"{\"Ok\":1}", r.ttl).await;
    assert!(matches!(late, Err(IdemError::LeaseLost { .. })), "{late:?}");
    assert!(store.fail(&biz, "k", &held).await.is_err());
    assert!(
        store.load(&biz, "k").await.unwrap().is_none(),
        "nothing was recreated"
    );
}

/// A mark sent again by the same claim (after its reply was lost, say) succeeds and changes
/// nothing; a complete after a fail (or the reverse) is refused.
pub async fn marking_again_with_the_same_claim_succeeds(s: Subject) {
    let (store, biz) = (s.store, biz("mark_again"));
    let (done, _) = acquire(&*store, &req(&biz, "c", secs(10))).await;
    store
        .complete(&biz, "c", &done, b"{\"Ok\":1}", TTL)
        .await
        .unwrap();
    let marked = store.load(&biz, "c").await.unwrap().unwrap();
    store
        .complete(&biz, "c", &done, b"{\"Ok\":1}", TTL)
        .await
        .expect("the same mark again");
    assert!(matches!(
        store.fail(&biz, "c", &done).await,
        Err(IdemError::LeaseLost { .. })
    ));
    let rec = store.load(&biz, "c").await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.snapshot.as_deref()),
        (Status::Succeeded, Some(&b"{\"Ok\":1}"[..]))
    );
    assert_eq!(
        rec, marked,
        "the mark again changes nothing, its expiry included"
    );

    let (failed, _) = acquire(&*store, &req(&biz, "f", secs(10))).await;
    store.fail(&biz, "f", &failed).await.unwrap();
    store
        .fail(&biz, "f", &failed)
        .await
        .expect("the same mark again");
    assert!(matches!(
        store.complete(&biz, "f", &failed, b"{\"Ok\":2}", TTL).await,
        Err(IdemError::LeaseLost { .. })
    ));
    assert_eq!(
        store.load(&biz, "f").await.unwrap().unwrap().status,
        Status::Failed
    );
}

/// Renewal extends a held lease (and the record's life with it) and is refused to a stale claim.
pub async fn renew_extends_a_held_lease(s: Subject) {
    let (store, clock, biz) = (s.store, s.clock, biz("renew"));
    let r = ClaimRequest {
        ttl: secs(12),
        ..req(&biz, "k", secs(10))
    };
    let (held, _) = acquire(&*store, &r).await;
    clock.advance(secs(8));
    store.renew(&biz, "k", &held, secs(10)).await.unwrap();
    let rec = store.load(&biz, "k").await.unwrap().unwrap();
    assert!(rec.expire_at_ms >= rec.lease_until_ms, "{rec:?}");
    clock.advance(secs(8)); // 16 s: past the first lease and the TTL, inside the renewed lease
    assert!(matches!(
        store.claim(&r).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    clock.advance(secs(3)); // 19 s: the renewed lease has run out
    let (taker, how) = acquire(&*store, &r).await;
    assert!(
        matches!(how, Acquired::TakeOver | Acquired::Fresh),
        "{how:?}"
    );
    let stale = store.renew(&biz, "k", &held, secs(10)).await;
    assert!(
        matches!(stale, Err(IdemError::LeaseLost { .. })),
        "{stale:?}"
    );
    assert!(taker.fence > held.fence);
}

/// A late complete from the old holder and a takeover by a new caller, released together: exactly
/// one wins, and the record agrees with the winner.
pub async fn a_takeover_racing_a_late_complete_has_one_winner(s: Subject) {
    let (store, clock, biz) = (s.store, s.clock, biz("race_late"));
    let keys = 24;
    let mut held = Vec::new();
    for k in 0..keys {
        let key = format!("k{k}");
        held.push(acquire(&*store, &req(&biz, &key, secs(10))).await.0);
    }
    clock.advance(secs(11));
    let barrier = Arc::new(Barrier::new(keys * 2));
    let mut tasks = Vec::new();
    for (k, old) in held.into_iter().enumerate() {
        let key = format!("k{k}");
        let (store1, biz1, key1, b1) = (store.clone(), biz.clone(), key.clone(), barrier.clone());
        let late = tokio::spawn(async move {
            b1.wait().await;
            store1
                .complete(&biz1, &key1, &old, b"{\"Ok\":\"late\"}", TTL)
                .await
        });
        let (store2, biz2, key2, b2) = (store.clone(), biz.clone(), key.clone(), barrier.clone());
        let taker = tokio::spawn(async move {
            b2.wait().await;
            store2.claim(&req(&biz2, &key2, secs(10))).await
        });
        tasks.push((key, late, taker));
    }
    let (mut late_won, mut taker_won) = (0, 0);
    for (key, late, taker) in tasks {
        let late = late.await.unwrap();
        let taker = taker.await.unwrap().unwrap();
        let rec = store.load(&biz, &key).await.unwrap().unwrap();
        match (&late, &taker) {
            (Ok(()), ClaimOutcome::Replay { snapshot }) => {
                late_won += 1;
                assert_eq!(snapshot, b"{\"Ok\":\"late\"}");
                assert_eq!(rec.status, Status::Succeeded);
            }
            (Err(IdemError::LeaseLost { .. }), ClaimOutcome::Acquired { claim, .. }) => {
                taker_won += 1;
                assert_eq!((rec.status, rec.fence), (Status::Processing, claim.fence));
            }
            other => panic!("{key}: both or neither won: {other:?}"),
        }
    }
    assert_eq!(late_won + taker_won, keys);
}

/// A holder stalls past its lease and a crowd arrives at once: exactly one caller takes the claim
/// over and runs the business; everyone gets that one answer.
pub async fn a_contended_takeover_runs_the_business_once(s: Subject) {
    let (store, clock, fx, biz) = (s.store, s.clock, Effects::new().await, biz("crowd"));
    let keys = 8;
    let callers = 16;
    for k in 0..keys {
        acquire(&*store, &req(&biz, &format!("k{k}"), secs(10))).await;
    }
    clock.advance(secs(11));
    let barrier = Arc::new(Barrier::new(keys * callers));
    let mut tasks = Vec::new();
    for k in 0..keys {
        for _ in 0..callers {
            let (store, fx, biz, barrier) =
                (store.clone(), fx.clone(), biz.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let key = format!("k{k}");
                barrier.wait().await;
                let (res, report) = idem::metrics::observe(
                    call(&biz, &key)
                        .lease(secs(10))
                        .wait(secs(60))
                        .run(&*store, pay(&fx, &biz, &key, k as u64)),
                )
                .await;
                (k, res.unwrap(), report.unwrap().outcome)
            }));
        }
    }
    let mut answers: Vec<Option<Receipt>> = vec![None; keys];
    let mut taken_over = 0;
    for t in tasks {
        let (k, receipt, outcome) = t.await.unwrap();
        match outcome {
            idem::metrics::Outcome::TakenOver => taken_over += 1,
            idem::metrics::Outcome::Replayed => {}
            other => panic!("unexpected outcome {other:?}"),
        }
        match &answers[k] {
            None => answers[k] = Some(receipt),
            Some(first) => assert_eq!(first, &receipt, "key {k}: one answer for all"),
        }
    }
    assert_eq!(taken_over, keys, "one takeover per key");
    assert_eq!(
        fx.totals(&biz).await,
        (keys as i64, keys as i64),
        "one execution per key"
    );
}

/// A burst in which bodies fail: every key's business fails on its first two executions, callers
/// retry until they get an answer. The ledger records successes only: one per key.
pub async fn a_burst_with_failing_bodies_executes_each_key_once(s: Subject) {
    use std::collections::HashMap;
    use std::sync::Mutex;
    let (store, fx, biz) = (s.store, Effects::new().await, biz("burst_fail"));
    let keys = 16;
    let callers = 8;
    let runs: Arc<Mutex<HashMap<usize, u32>>> = Arc::default();
    let barrier = Arc::new(Barrier::new(keys * callers));
    let mut tasks = Vec::new();
    for k in 0..keys {
        for _ in 0..callers {
            let (store, fx, biz, barrier, runs) = (
                store.clone(),
                fx.clone(),
                biz.clone(),
                barrier.clone(),
                runs.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let key = format!("k{k}");
                barrier.wait().await;
                let mut outcomes = Vec::new();
                loop {
                    let (res, report) = idem::metrics::observe(
                        call(&biz, &key).wait(secs(60)).run(&*store, async {
                            let run = {
                                let mut runs = runs.lock().unwrap();
                                let n = runs.entry(k).or_insert(0);
                                *n += 1;
                                *n
                            };
                            if run <= 2 {
                                return Err(PayError::Declined);
                            }
                            pay(&fx, &biz, &key, k as u64).await
                        }),
                    )
                    .await;
                    outcomes.push(report.unwrap().outcome);
                    match res {
                        Ok(receipt) => return (k, receipt, outcomes),
                        Err(PayError::Declined) => continue,
                        Err(e) => panic!("key {k}: {e:?}"),
                    }
                }
            }));
        }
    }
    let mut answers: Vec<Option<Receipt>> = vec![None; keys];
    let (mut executed, mut failed) = (0, 0);
    for t in tasks {
        let (k, receipt, outcomes) = t.await.unwrap();
        executed += outcomes
            .iter()
            .filter(|o| **o == idem::metrics::Outcome::Executed)
            .count();
        failed += outcomes
            .iter()
            .filter(|o| **o == idem::metrics::Outcome::Failed)
            .count();
        match &answers[k] {
            None => answers[k] = Some(receipt),
            Some(first) => assert_eq!(first, &receipt),
        }
    }
    assert_eq!(
        fx.totals(&biz).await,
        (keys as i64, keys as i64),
        "one success per key"
    );
    assert_eq!(
        (executed, failed),
        (keys, 2 * keys),
        "outcomes seen by the callers"
    );
    let runs = runs.lock().unwrap();
    assert!(
        runs.values().all(|n| *n == 3),
        "each key's body ran 3 times: {runs:?}"
    );
}

// ---- failures inside the body ---------------------------------------------------------------

pub async fn panic_in_body_never_claims_success(s: Subject) {
    let (store, clock, fx, biz) = (s.store, s.clock, Effects::new().await, biz("panic"));
    let task = {
        let (store, biz) = (store.clone(), biz.clone());
        tokio::spawn(async move {
            let _: Result<Receipt, PayError> = call(&biz, "o")
                .lease(secs(10))
                .run(&*store, async { panic!("business blew up") })
                .await;
        })
    };
    assert!(task.await.unwrap_err().is_panic());
    let rec = store.load(&biz, "o").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.snapshot), (Status::Processing, None));
    clock.advance(secs(11));
    let retried = call(&biz, "o")
        .lease(secs(10))
        .run(&*store, pay(&fx, &biz, "o", 9))
        .await
        .unwrap();
    assert_eq!(retried.amount, 9);
    assert_eq!(fx.count(&biz, "o").await, 1);
}

pub async fn dropped_future_never_claims_success(s: Subject) {
    let (store, clock, fx, biz) = (s.store, s.clock, Effects::new().await, biz("drop"));
    let running = {
        let (store, fx, biz) = (store.clone(), fx.clone(), biz.clone());
        tokio::spawn(async move {
            call(&biz, "o")
                .lease(secs(10))
                .run(&*store, async {
                    tokio::time::sleep(secs(60)).await;
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
    clock.advance(secs(11));
    call(&biz, "o")
        .lease(secs(10))
        .run(&*store, pay(&fx, &biz, "o", 1))
        .await
        .unwrap();
    assert_eq!(fx.count(&biz, "o").await, 1);
}

/// The body can read its claim's fence (to pass to its own downstream writes); it is the fence the
/// store holds.
pub async fn the_body_learns_its_fence(s: Subject) {
    let (store, biz) = (s.store, biz("fence_body"));
    assert!(idem::current_claim().is_none(), "no claim outside a body");
    let seen: Result<(u32, u64), IdemError> = call(&biz, "o")
        .run(&*store, async {
            let claim = idem::current_claim().expect("inside the body");
            Ok((claim.attempt, claim.fence.get()))
        })
        .await;
    let (attempt, fence) = seen.unwrap();
    let rec = store.load(&biz, "o").await.unwrap().unwrap();
    assert_eq!((attempt, fence), (rec.attempt, rec.fence.get()));
}

// ---- bad input ------------------------------------------------------------------------------

pub async fn bad_keys_are_refused_before_anything_is_written(s: Subject) {
    let store = s.store;
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

pub async fn bad_biz_is_refused(s: Subject) {
    let store = s.store;
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

pub async fn unstorable_results_keep_the_claim(s: Subject) {
    let store = s.store;
    let (fx, biz) = (Effects::new().await, biz("unstorable"));
    // Over the snapshot limit.
    let big = "x".repeat(store.limits().max_snapshot_len + 1);
    for _ in 0..2 {
        let (res, report) = idem::metrics::observe(call(&biz, "big").run(&*store, async {
            fx.record(&biz, "big").await;
            Ok::<String, PayError>(big.clone())
        }))
        .await;
        assert_eq!(
            report.unwrap().outcome,
            idem::metrics::Outcome::Unstorable,
            "a result that could not be stored is its own outcome, not executed or replayed"
        );
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

pub async fn unfingerprintable_payload_is_refused(s: Subject) {
    let store = s.store;
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
/// other: every key's business runs exactly once and every caller gets that one answer. Up to
/// 12,800 calls share a pool of 16 connections here, so a claim may wait longer for its
/// connection than the default store timeout (10 s): the calls are given as long as their wait.
pub async fn burst_executes_each_key_once(s: Subject, keys: usize, callers: usize) {
    let store = s.store;
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
                    .store_timeout(Duration::from_secs(60))
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

/// Calls `$callback!($($prefix)* <every contract case>)`: the one list of cases, shared by
/// [`contract_suite!`] (a test per case) and [`contract_sequence!`] (every case in one test).
#[macro_export]
macro_rules! with_contract_cases {
    ($callback:ident ! ($($prefix:tt)*)) => {
        $crate::$callback!($($prefix)*
            fresh_key_runs_once_then_replays,
            the_decision_table_holds_when_claims_read_first,
            same_key_other_biz_is_another_record,
            succeeded_with_other_payload_is_a_mismatch,
            fingerprints_compare_by_their_digest,
            processing_with_valid_lease_is_in_progress,
            processing_with_other_payload_is_a_mismatch,
            expired_lease_is_taken_over_and_the_late_finisher_is_fenced,
            failure_allows_a_retry,
            expired_record_counts_as_absent_and_is_swept,
            waiting_duplicate_gets_the_first_answer,
            a_live_lease_outlives_the_ttl,
            a_sweep_spares_a_record_under_a_live_lease,
            a_success_outlives_a_body_slower_than_its_ttl,
            a_fence_never_repeats_after_a_sweep,
            complete_after_a_sweep_is_lease_lost,
            renew_extends_a_held_lease,
            marking_again_with_the_same_claim_succeeds,
            a_takeover_racing_a_late_complete_has_one_winner,
            a_contended_takeover_runs_the_business_once,
            a_burst_with_failing_bodies_executes_each_key_once,
            panic_in_body_never_claims_success,
            dropped_future_never_claims_success,
            the_body_learns_its_fence,
            bad_keys_are_refused_before_anything_is_written,
            bad_biz_is_refused,
            unstorable_results_keep_the_claim,
            unfingerprintable_payload_is_refused,
            distinct_pairs_are_distinct_records,
            durations_at_the_limits,
            a_store_clamps_durations_it_is_handed,
            a_takeover_asks_recover_before_running_the_body,
            a_failed_recover_releases_the_claim,
            recover_is_not_asked_for_a_fresh_claim_or_a_retry,
            stuck_lists_ended_leases_oldest_first,
            the_reconciler_resolves_stuck_records_in_batches,
            a_takeover_racing_the_reconciler_has_one_winner,
            saved_steps_are_fenced_and_outlive_takeovers_and_failures,
            a_new_life_or_another_payload_starts_without_steps,
            a_takeover_runs_only_the_steps_not_saved,
            a_retry_after_a_failure_resumes_after_the_saved_steps,
            steps_are_refused_with_clear_errors,
            stats_count_records_per_biz_and_status,
            stats_count_layer_records_per_route,
            release_ends_the_lease_and_the_retry_recovers_the_effect,
            mark_failed_moves_an_ended_lease_to_failed_and_the_next_call_runs,
            release_refuses_a_success_a_live_lease_an_absent_key_and_a_bad_reason,
            a_release_racing_a_takeover_has_one_winner,
            stuck_all_lists_ended_leases_across_business_types,
            a_repeat_after_its_result_ttl_is_refused_until_the_ttl_ends,
            a_result_ttl_is_checked_and_the_default_keeps_the_result,
        );
    };
}

/// Generates one `#[tokio::test]` per contract case for a backend. `$make` is an async fn taking
/// the `TestClock` the store must read and giving `Option<Arc<dyn Store>>` (None: the backend's
/// server is unreachable and the suite is skipped with one line, unless IDEM_REQUIRE_SERVICES=1).
#[macro_export]
macro_rules! contract_suite {
    ($make:path, burst = ($keys:expr, $callers:expr)) => {
        $crate::with_contract_cases!(contract_suite!(@cases $make;));
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn burst_executes_each_key_once() {
            let clock = idem::TestClock::new();
            if let Some(store) = $make(clock.clone()).await {
                contract::burst_executes_each_key_once(contract::Subject { store, clock }, $keys, $callers).await;
            }
        }
    };
    (@cases $make:path; $($case:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            let clock = idem::TestClock::new();
            if let Some(store) = $make(clock.clone()).await {
                contract::$case(contract::Subject { store, clock }).await;
            }
        }
    )*};
}

/// Every contract case, one after the other, inside the caller's async context (for a backend
/// whose server the test starts and stops itself): `contract_sequence!(make)` is an expression;
/// `make` gives a store on a fresh `TestClock` (a `Store`, not an `Option`).
#[macro_export]
macro_rules! contract_sequence {
    ($make:expr) => {
        $crate::with_contract_cases!(contract_sequence!(@cases $make;))
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {{
        $(
            let clock = idem::TestClock::new();
            let store = $make(clock.clone()).await;
            eprintln!("contract case {}", stringify!($case));
            contract::$case(contract::Subject { store, clock }).await;
        )*
    }};
}
