//! The store contract: every backend runs this same suite (see `contract_suite!` at the bottom),
//! and every backend with transactions runs `tx.rs` too.
//!
//! Side effects are counted in an independent SQLite table (`effects`), never with idem's own
//! counters, so "executed once" is proven by what the business actually did. Lease and TTL edges
//! are driven by a `TestClock` handed to the store, never by sleeps a loaded machine can reorder.

#![allow(dead_code)]

pub mod admin;
pub mod bad_input;
pub mod batch;
pub mod body_failures;
pub mod decisions;
pub mod edges;
pub mod keys;
pub mod leases;
pub mod pool;
pub mod reconcile;
pub mod recover;
pub mod result_ttl;
pub mod server;
pub mod steps;
pub mod storm;
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
pub use bad_input::{
    bad_biz_is_refused, bad_keys_are_refused_before_anything_is_written,
    unfingerprintable_payload_is_refused, unstorable_results_keep_the_claim,
};
#[allow(unused_imports)]
pub use batch::{
    a_batch_claim_decides_each_key_as_a_claim_would, a_batch_marks_each_key_on_its_own,
    a_batch_of_marks_marks_each_under_its_own_fence, a_batch_of_new_keys_is_claimed_then_replayed,
    batches_run_each_key_once_under_a_barrier,
};
#[allow(unused_imports)]
pub use body_failures::{
    dropped_future_never_claims_success, panic_in_body_never_claims_success,
    the_body_learns_its_fence,
};
#[allow(unused_imports)]
pub use decisions::{
    expired_lease_is_taken_over_and_the_late_finisher_is_fenced,
    expired_record_counts_as_absent_and_is_swept, failure_allows_a_retry,
    fingerprints_compare_by_their_digest, fresh_key_runs_once_then_replays,
    processing_with_other_payload_is_a_mismatch, processing_with_valid_lease_is_in_progress,
    same_key_other_biz_is_another_record, succeeded_with_other_payload_is_a_mismatch,
    the_decision_table_holds_when_claims_read_first, waiting_duplicate_gets_the_first_answer,
};
#[allow(unused_imports)]
pub use edges::{
    a_store_clamps_durations_it_is_handed, distinct_pairs_are_distinct_records,
    durations_at_the_limits,
};
#[allow(unused_imports)]
pub use keys::list_keys_walks_every_record_in_pages_and_resumes;
#[allow(unused_imports)]
pub use leases::{
    a_burst_with_failing_bodies_executes_each_key_once,
    a_contended_takeover_runs_the_business_once, a_fence_never_repeats_after_a_sweep,
    a_live_lease_outlives_the_ttl, a_mark_under_another_fence_changes_nothing,
    a_record_outlives_its_expiry_and_lease_through_sweeps_and_reclaims,
    a_success_outlives_a_body_slower_than_its_ttl, a_sweep_spares_a_record_under_a_live_lease,
    a_takeover_racing_a_late_complete_has_one_winner, complete_after_a_sweep_is_lease_lost,
    marking_again_with_the_same_claim_succeeds, renew_extends_a_held_lease,
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
#[allow(unused_imports)]
pub use storm::burst_executes_each_key_once;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem::sqlx::sqlite::SqlitePoolOptions;
use idem::sqlx::{self, SqlitePool};
use idem::{
    Call, IdemError, Store, TestClock,
    store::{Acquired, Claim, ClaimOutcome, ClaimRequest, Status},
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
            a_record_outlives_its_expiry_and_lease_through_sweeps_and_reclaims,
            a_success_outlives_a_body_slower_than_its_ttl,
            a_fence_never_repeats_after_a_sweep,
            complete_after_a_sweep_is_lease_lost,
            renew_extends_a_held_lease,
            marking_again_with_the_same_claim_succeeds,
            a_mark_under_another_fence_changes_nothing,
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
            list_keys_walks_every_record_in_pages_and_resumes,
            release_ends_the_lease_and_the_retry_recovers_the_effect,
            mark_failed_moves_an_ended_lease_to_failed_and_the_next_call_runs,
            release_refuses_a_success_a_live_lease_an_absent_key_and_a_bad_reason,
            a_release_racing_a_takeover_has_one_winner,
            stuck_all_lists_ended_leases_across_business_types,
            a_repeat_after_its_result_ttl_is_refused_until_the_ttl_ends,
            a_result_ttl_is_checked_and_the_default_keeps_the_result,
            a_batch_claim_decides_each_key_as_a_claim_would,
            a_batch_of_new_keys_is_claimed_then_replayed,
            a_batch_marks_each_key_on_its_own,
            a_batch_of_marks_marks_each_under_its_own_fence,
            batches_run_each_key_once_under_a_barrier,
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
