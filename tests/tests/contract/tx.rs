//! The transaction-mode contract: every store with transactions runs these cases (see
//! `tx_contract_suite!`). The business writes its side effect inside the caller's transaction, in
//! a table of the store's own database, so "claim, business and mark commit or roll back together"
//! is checked against what the database really holds.

use std::sync::Arc;
use std::time::Duration;

use idem::metrics::Outcome;
use idem::{Call, IdemError, IdemTx, Store, store::Status};
use tokio::sync::Barrier;

use super::{PayError, Receipt, biz, call};

/// A backend with transactions, as the tx suite drives it.
pub trait TxBackend: Send + Sync + 'static {
    /// The backend's transaction (`store.begin()`).
    type Tx: IdemTx + Send;

    /// The store the transactions are begun on.
    fn store(&self) -> Arc<dyn Store>;

    /// Begins a transaction on the store's database.
    fn begin(&self) -> impl Future<Output = Self::Tx> + Send;

    /// Begins a transaction for a call that claims `(biz, key)` (a sharded store begins it on the
    /// key's shard); by default [`TxBackend::begin`].
    fn begin_for(&self, biz: &str, key: &str) -> impl Future<Output = Self::Tx> + Send {
        let _ = (biz, key);
        self.begin()
    }

    /// `n` keys of `biz` that one transaction may claim together (a sharded store: keys of one
    /// shard); by default `k0`, `k1`, ….
    fn keys_in_one_transaction(&self, biz: &str, n: usize) -> Vec<String> {
        let _ = biz;
        (0..n).map(|i| format!("k{i}")).collect()
    }

    /// Commits.
    fn commit(tx: Self::Tx) -> impl Future<Output = ()> + Send;

    /// Rolls back.
    fn rollback(tx: Self::Tx) -> impl Future<Output = ()> + Send;

    /// The business's side effect, written inside `tx`; returns its row id.
    fn write_effect(tx: &mut Self::Tx, biz: &str, key: &str) -> impl Future<Output = i64> + Send;

    /// Committed side effects for `(biz, key)`.
    fn effects(&self, biz: &str, key: &str) -> impl Future<Output = i64> + Send;
}

/// The first `n` of `k0`, `k1`, … that `shard_of` puts where it puts `k0` (for
/// [`TxBackend::keys_in_one_transaction`] on a sharded store).
pub fn keys_of_one_shard(shard_of: impl Fn(&str) -> usize, n: usize) -> Vec<String> {
    let shard = shard_of("k0");
    (0..)
        .map(|i| format!("k{i}"))
        .filter(|key| shard_of(key) == shard)
        .take(n)
        .collect()
}

/// The business in a transaction: writes its effect in `tx`, then answers or declines.
async fn pay_in<B: TxBackend>(
    tx: &mut B::Tx,
    biz: &str,
    key: &str,
    decline: bool,
) -> Result<Receipt, PayError> {
    let row = B::write_effect(tx, biz, key).await;
    if decline {
        return Err(PayError::Declined);
    }
    Ok(Receipt {
        order: key.to_owned(),
        amount: 100,
        serial: u32::try_from(row).unwrap(),
    })
}

async fn run<B: TxBackend>(
    tx: &mut B::Tx,
    c: Call,
    biz: &str,
    key: &str,
    decline: bool,
) -> Result<Receipt, PayError> {
    c.run_in_tx(tx, async |tx: &mut B::Tx| {
        pay_in::<B>(tx, biz, key, decline).await
    })
    .await
}

pub async fn commit_keeps_claim_business_and_mark_together<B: TxBackend>(b: Arc<B>) {
    let (store, biz) = (b.store(), biz("tx_commit"));
    let mut tx = b.begin_for(&biz, "k").await;
    let (first, report) =
        idem::metrics::observe(run::<B>(&mut tx, call(&biz, "k"), &biz, "k", false)).await;
    let first = first.unwrap();
    assert_eq!(
        report.unwrap().outcome,
        Outcome::Executed,
        "tx-mode calls are reported"
    );
    B::commit(tx).await;
    let rec = store.load(&biz, "k").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.attempt), (Status::Succeeded, 1));

    let mut tx = b.begin_for(&biz, "k").await;
    let (again, report) =
        idem::metrics::observe(run::<B>(&mut tx, call(&biz, "k"), &biz, "k", false)).await;
    B::commit(tx).await;
    assert_eq!(again.unwrap(), first);
    assert!(report.unwrap().replayed());
    assert_eq!(b.effects(&biz, "k").await, 1);
}

pub async fn body_error_rolls_back_the_claim_and_the_business_writes<B: TxBackend>(b: Arc<B>) {
    let (store, biz) = (b.store(), biz("tx_err"));
    let mut tx = b.begin_for(&biz, "k").await;
    let (res, report) =
        idem::metrics::observe(run::<B>(&mut tx, call(&biz, "k"), &biz, "k", true)).await;
    assert!(matches!(res, Err(PayError::Declined)), "{res:?}");
    assert_eq!(report.unwrap().outcome, Outcome::Failed);
    // Even if the caller commits after the error, neither the claim nor the business row survive.
    B::commit(tx).await;
    assert!(store.load(&biz, "k").await.unwrap().is_none());
    assert_eq!(b.effects(&biz, "k").await, 0);

    let mut tx = b.begin_for(&biz, "k").await;
    run::<B>(&mut tx, call(&biz, "k"), &biz, "k", false)
        .await
        .unwrap();
    B::commit(tx).await;
    assert_eq!(b.effects(&biz, "k").await, 1);
    assert_eq!(store.load(&biz, "k").await.unwrap().unwrap().attempt, 1);
}

pub async fn caller_rollback_after_success_leaves_nothing_and_a_retry_runs<B: TxBackend>(
    b: Arc<B>,
) {
    let (store, biz) = (b.store(), biz("tx_rollback"));
    let mut tx = b.begin_for(&biz, "k").await;
    run::<B>(&mut tx, call(&biz, "k"), &biz, "k", false)
        .await
        .unwrap();
    B::rollback(tx).await;
    assert!(
        store.load(&biz, "k").await.unwrap().is_none(),
        "the claim must roll back with the business"
    );
    assert_eq!(b.effects(&biz, "k").await, 0);

    let mut tx = b.begin_for(&biz, "k").await;
    run::<B>(&mut tx, call(&biz, "k"), &biz, "k", false)
        .await
        .unwrap();
    B::commit(tx).await;
    assert_eq!(b.effects(&biz, "k").await, 1);
}

/// 16 transactions carrying the same key, released at once: one executes, the others wait for its
/// commit (the database's lock) and replay its answer.
pub async fn concurrent_duplicates_in_transactions_execute_once<B: TxBackend>(b: Arc<B>) {
    let biz = biz("tx_burst");
    let barrier = Arc::new(Barrier::new(16));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (b, barrier, biz) = (b.clone(), barrier.clone(), biz.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let mut tx = b.begin_for(&biz, "k").await;
                let receipt = run::<B>(&mut tx, call(&biz, "k"), &biz, "k", false)
                    .await
                    .unwrap();
                B::commit(tx).await;
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
    assert_eq!(b.effects(&biz, "k").await, 1);
}

pub async fn payload_mismatch_in_a_transaction_writes_nothing<B: TxBackend>(b: Arc<B>) {
    let biz = biz("tx_fp");
    let mut tx = b.begin_for(&biz, "k").await;
    run::<B>(&mut tx, call(&biz, "k").fingerprint(&1), &biz, "k", false)
        .await
        .unwrap();
    B::commit(tx).await;
    let mut tx = b.begin_for(&biz, "k").await;
    let res = run::<B>(&mut tx, call(&biz, "k").fingerprint(&2), &biz, "k", false).await;
    B::commit(tx).await;
    assert!(
        matches!(res, Err(PayError::Idem(IdemError::PayloadMismatch))),
        "{res:?}"
    );
    assert_eq!(b.effects(&biz, "k").await, 1);
}

/// Lease mode and transaction mode share one table: each replays what the other did.
pub async fn lease_and_transaction_modes_see_each_other<B: TxBackend>(b: Arc<B>) {
    let (store, biz) = (b.store(), biz("tx_modes"));
    let leased: Result<Receipt, PayError> = call(&biz, "a")
        .run(&*store, async {
            Ok(Receipt {
                order: "a".into(),
                amount: 1,
                serial: 0,
            })
        })
        .await;
    let mut tx = b.begin_for(&biz, "a").await;
    let in_tx = run::<B>(&mut tx, call(&biz, "a"), &biz, "a", false).await;
    B::commit(tx).await;
    assert_eq!(
        in_tx.unwrap(),
        leased.unwrap(),
        "tx mode replays a lease-mode record"
    );
    assert_eq!(b.effects(&biz, "a").await, 0);

    let mut tx = b.begin_for(&biz, "b").await;
    let first = run::<B>(&mut tx, call(&biz, "b"), &biz, "b", false)
        .await
        .unwrap();
    B::commit(tx).await;
    let replay: Result<Receipt, PayError> = call(&biz, "b")
        .run(&*store, async { panic!("must replay, not run") })
        .await;
    assert_eq!(
        replay.unwrap(),
        first,
        "lease mode replays a committed tx-mode record"
    );
}

/// The body sees its claim's fence in transaction mode too, and it is the fence stored.
pub async fn the_body_learns_its_fence_in_a_transaction<B: TxBackend>(b: Arc<B>) {
    let (store, biz) = (b.store(), biz("tx_fence"));
    let mut tx = b.begin_for(&biz, "k").await;
    let seen: Result<u64, IdemError> = call(&biz, "k")
        .run_in_tx(&mut tx, async |_tx: &mut B::Tx| {
            Ok(idem::steps::current_claim().unwrap().fence.get())
        })
        .await;
    B::commit(tx).await;
    assert_eq!(
        seen.unwrap(),
        store.load(&biz, "k").await.unwrap().unwrap().fence.get()
    );
}

/// In a transaction a step is plain code (its save would roll back with the transaction a crash
/// ends): it runs every time and nothing is saved; its downstream key is the lease-mode one.
pub async fn steps_in_a_transaction_run_as_plain_code<B: TxBackend>(b: Arc<B>) {
    let (store, biz) = (b.store(), biz("tx_steps"));
    let mut tx = b.begin_for(&biz, "k").await;
    let ran = std::sync::atomic::AtomicU32::new(0);
    let seen: Result<String, IdemError> = call(&biz, "k")
        .run_in_tx(&mut tx, async |_tx: &mut B::Tx| {
            for _ in 0..2 {
                idem::step("one", async {
                    ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok::<_, IdemError>(1u32)
                })
                .await?;
            }
            Ok(idem::steps::step_key("one").expect("inside the body"))
        })
        .await;
    B::commit(tx).await;
    assert_eq!(
        ran.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "not saved"
    );
    let tx_key = seen.unwrap();
    // The same (biz, key, name) in lease mode, on any store, gives the same key.
    let lease_key: String = call(&biz, "k")
        .run(&idem::MemoryStore::new(), async {
            Ok::<_, IdemError>(idem::steps::step_key("one").unwrap())
        })
        .await
        .unwrap();
    assert_eq!(tx_key.len(), 32);
    assert_eq!(tx_key, lease_key);
    let rec = store.load(&biz, "k").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.steps), (Status::Succeeded, None));
}

/// A result that cannot be stored: the business ran, so the claim is kept as done (with the
/// business writes, when the caller commits) and a repeat gets the same error without running.
pub async fn an_unstorable_result_in_a_transaction_keeps_the_claim<B: TxBackend>(b: Arc<B>) {
    let (store, biz) = (b.store(), biz("tx_unstorable"));
    let big = "x".repeat(store.limits().max_snapshot_len + 1);
    for round in 0..2 {
        let mut tx = b.begin_for(&biz, "k").await;
        let (res, report) =
            idem::metrics::observe(call(&biz, "k").run_in_tx(&mut tx, async |tx: &mut B::Tx| {
                B::write_effect(tx, &biz, "k").await;
                Ok::<_, PayError>(big.clone())
            }))
            .await;
        B::commit(tx).await;
        assert!(
            matches!(
                res,
                Err(PayError::Idem(IdemError::ResultNotStorable { .. }))
            ),
            "round {round}: {res:?}"
        );
        assert_eq!(
            report.unwrap().outcome,
            Outcome::Unstorable,
            "its own outcome"
        );
    }
    assert_eq!(b.effects(&biz, "k").await, 1, "the business ran once");
}

/// Three calls in one transaction: the middle one's body fails. Its claim and writes roll back to
/// its savepoint; the others' (whose savepoints a later claim or the commit releases) stay.
pub async fn calls_in_one_transaction_keep_each_others_writes<B: TxBackend>(b: Arc<B>) {
    let (store, biz) = (b.store(), biz("tx_three"));
    let keys = b.keys_in_one_transaction(&biz, 3);
    let [a_key, b_key, c_key] = [&keys[0], &keys[1], &keys[2]].map(String::as_str);
    let mut tx = b.begin_for(&biz, a_key).await;
    let a = run::<B>(&mut tx, call(&biz, a_key), &biz, a_key, false).await;
    let declined = run::<B>(&mut tx, call(&biz, b_key), &biz, b_key, true).await;
    let c = run::<B>(&mut tx, call(&biz, c_key), &biz, c_key, false).await;
    B::commit(tx).await;
    assert!(matches!(declined, Err(PayError::Declined)), "{declined:?}");
    let (a, c) = (a.unwrap(), c.unwrap());
    assert_eq!(
        (
            b.effects(&biz, a_key).await,
            b.effects(&biz, b_key).await,
            b.effects(&biz, c_key).await
        ),
        (1, 0, 1)
    );
    assert!(
        store.load(&biz, b_key).await.unwrap().is_none(),
        "no claim of the failed call is left"
    );
    for (key, first) in [(a_key, &a), (c_key, &c)] {
        let mut tx = b.begin_for(&biz, key).await;
        let again = run::<B>(&mut tx, call(&biz, key), &biz, key, false).await;
        B::commit(tx).await;
        assert_eq!(&again.unwrap(), first, "{key} replays");
    }
    let mut tx = b.begin_for(&biz, b_key).await;
    run::<B>(&mut tx, call(&biz, b_key), &biz, b_key, false)
        .await
        .unwrap();
    B::commit(tx).await;
    assert_eq!(
        b.effects(&biz, b_key).await,
        1,
        "the failed call runs on its retry"
    );
}

/// A key and a fingerprint with quotes, a backslash, a statement separator, a comment and bytes
/// beyond ASCII: the claim sent with its savepoint writes them as literals, byte for byte.
pub async fn any_bytes_in_a_key_claim_in_a_transaction<B: TxBackend>(b: Arc<B>) {
    let (store, biz) = (b.store(), biz("tx_bytes"));
    let key = "it's \\'; DROP TABLE x; -- \"é\" $1 ? 订单";
    let mut tx = b.begin_for(&biz, key).await;
    let first = run::<B>(&mut tx, call(&biz, key).fingerprint(&key), &biz, key, false)
        .await
        .unwrap();
    B::commit(tx).await;
    let rec = store
        .load(&biz, key)
        .await
        .unwrap()
        .expect("the record, under its key");
    assert_eq!((rec.key.as_str(), rec.status), (key, Status::Succeeded));
    let mut tx = b.begin_for(&biz, key).await;
    let again = run::<B>(&mut tx, call(&biz, key).fingerprint(&key), &biz, key, false).await;
    B::commit(tx).await;
    assert_eq!(again.unwrap(), first, "a replay: the same fingerprint");
    let mut tx = b.begin_for(&biz, key).await;
    let other = run::<B>(&mut tx, call(&biz, key).fingerprint(&1), &biz, key, false).await;
    B::commit(tx).await;
    assert!(
        matches!(other, Err(PayError::Idem(IdemError::PayloadMismatch))),
        "{other:?}"
    );
    assert_eq!(b.effects(&biz, key).await, 1);
}

/// A call whose body fails takes back its own claim and writes, never what the caller wrote in
/// the transaction before it: the call's undo goes to a savepoint opened after those writes (a
/// store may open the first claim's savepoint with the transaction's BEGIN, as Postgres does
/// while new keys prevail, and must then not use it once the caller ran something). Run with the
/// store's claims inserting first, where that savepoint is opened.
pub async fn a_failed_call_keeps_the_callers_earlier_writes<B: TxBackend>(b: Arc<B>) {
    let (store, biz) = (b.store(), biz("tx_before"));
    let keys = b.keys_in_one_transaction(&biz, 2);
    let (before, key) = (&keys[0], &keys[1]);
    super::turned_to_write_first(&*store).await;
    let mut tx = b.begin_for(&biz, key).await;
    B::write_effect(&mut tx, &biz, before).await;
    let declined = run::<B>(&mut tx, call(&biz, key), &biz, key, true).await;
    assert!(matches!(declined, Err(PayError::Declined)), "{declined:?}");
    B::commit(tx).await;
    assert_eq!(
        b.effects(&biz, before).await,
        1,
        "the caller's own write before the call stays"
    );
    assert_eq!(
        b.effects(&biz, key).await,
        0,
        "the failed call's write goes"
    );
    assert!(store.load(&biz, key).await.unwrap().is_none());

    // Nothing run before the call: its undo still leaves the transaction usable and empty of it.
    let mut tx = b.begin_for(&biz, key).await;
    let declined = run::<B>(&mut tx, call(&biz, key), &biz, key, true).await;
    assert!(matches!(declined, Err(PayError::Declined)), "{declined:?}");
    B::write_effect(&mut tx, &biz, before).await;
    B::commit(tx).await;
    assert_eq!(
        b.effects(&biz, before).await,
        2,
        "a write after the failed call stays"
    );
    assert_eq!(b.effects(&biz, key).await, 0);
    assert!(store.load(&biz, key).await.unwrap().is_none());
}

/// A result kept 1 ms in transaction mode: the mark in the transaction records it, and once it
/// passed (a real 50 ms here: the transaction backends run on the store's own clock) a repeat,
/// in a transaction or in lease mode, is refused as `ResultExpired` and writes nothing.
pub async fn a_result_kept_shorter_than_its_key_in_a_transaction<B: TxBackend>(b: Arc<B>) {
    let (store, biz) = (b.store(), biz("tx_gone"));
    let kept = || {
        call(&biz, "k")
            .ttl(Duration::from_secs(60))
            .result_ttl(Duration::from_millis(1))
    };
    let mut tx = b.begin_for(&biz, "k").await;
    run::<B>(&mut tx, kept(), &biz, "k", false).await.unwrap();
    B::commit(tx).await;
    let rec = store.load(&biz, "k").await.unwrap().unwrap();
    assert!(rec.result_until_ms.is_some_and(|t| t > 0), "{rec:?}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut tx = b.begin_for(&biz, "k").await;
    let (late, report) = idem::metrics::observe(run::<B>(&mut tx, kept(), &biz, "k", false)).await;
    B::commit(tx).await;
    assert!(
        matches!(late, Err(PayError::Idem(IdemError::ResultExpired))),
        "{late:?}"
    );
    assert_eq!(report.unwrap().outcome, Outcome::ResultExpired);
    let leased: Result<Receipt, PayError> =
        kept().run(&*store, async { Err(PayError::Declined) }).await;
    assert!(
        matches!(leased, Err(PayError::Idem(IdemError::ResultExpired))),
        "{leased:?}"
    );
    assert_eq!(b.effects(&biz, "k").await, 1);
}

/// A key claimed, run and marked in a transaction, then called again in the same transaction:
/// the repeat meets the transaction's own uncommitted success (on Postgres under an advisory lock
/// the transaction already holds, on MySQL its own row lock) and replays it without running the
/// body; after the commit a repeat replays the same. Run with the store's claims inserting first,
/// so the repeat's claim starts with the insert.
pub async fn a_repeat_in_the_same_transaction_replays<B: TxBackend>(b: Arc<B>) {
    let biz = biz("tx_again");
    let key = "k";
    super::turned_to_write_first(&*b.store()).await;
    let mut tx = b.begin_for(&biz, key).await;
    let first = run::<B>(&mut tx, call(&biz, key), &biz, key, false)
        .await
        .unwrap();
    let again = run::<B>(&mut tx, call(&biz, key), &biz, key, false).await;
    B::commit(tx).await;
    assert_eq!(again.unwrap(), first, "the repeat replays the first answer");
    assert_eq!(b.effects(&biz, key).await, 1, "the body ran once");
    let mut tx = b.begin_for(&biz, key).await;
    let later = run::<B>(&mut tx, call(&biz, key), &biz, key, false).await;
    B::commit(tx).await;
    assert_eq!(later.unwrap(), first, "and so does one after the commit");
    assert_eq!(b.effects(&biz, key).await, 1);
}

/// The transaction cases once the store's claims read first (a live success is then answered by
/// one plain read, before any savepoint).
pub async fn transactions_hold_when_claims_read_first<B: TxBackend>(b: Arc<B>) {
    macro_rules! read_first {
        ($($case:ident),*) => {$(
            super::turned_to_read_first(&*b.store()).await;
            $case(b.clone()).await;
        )*};
    }
    read_first!(
        commit_keeps_claim_business_and_mark_together,
        body_error_rolls_back_the_claim_and_the_business_writes,
        caller_rollback_after_success_leaves_nothing_and_a_retry_runs,
        concurrent_duplicates_in_transactions_execute_once,
        payload_mismatch_in_a_transaction_writes_nothing,
        lease_and_transaction_modes_see_each_other,
        calls_in_one_transaction_keep_each_others_writes,
        a_result_kept_shorter_than_its_key_in_a_transaction,
        a_repeat_in_the_same_transaction_replays
    );
}

/// Generates one `#[tokio::test]` per tx-mode case. `$make` is an async fn giving `Option<Arc<B>>`
/// (None: the server is unreachable and the suite is skipped, unless IDEM_REQUIRE_SERVICES=1).
#[macro_export]
macro_rules! tx_contract_suite {
    ($make:path) => {
        $crate::tx_contract_suite!(@cases $make;
            commit_keeps_claim_business_and_mark_together,
            body_error_rolls_back_the_claim_and_the_business_writes,
            caller_rollback_after_success_leaves_nothing_and_a_retry_runs,
            concurrent_duplicates_in_transactions_execute_once,
            payload_mismatch_in_a_transaction_writes_nothing,
            lease_and_transaction_modes_see_each_other,
            the_body_learns_its_fence_in_a_transaction,
            an_unstorable_result_in_a_transaction_keeps_the_claim,
            steps_in_a_transaction_run_as_plain_code,
            calls_in_one_transaction_keep_each_others_writes,
            any_bytes_in_a_key_claim_in_a_transaction,
            a_failed_call_keeps_the_callers_earlier_writes,
            transactions_hold_when_claims_read_first,
            a_result_kept_shorter_than_its_key_in_a_transaction,
            a_repeat_in_the_same_transaction_replays,
        );
    };
    (@cases $make:path; $($case:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            if let Some(backend) = $make().await {
                contract::tx::$case(backend).await;
            }
        }
    )*};
}
