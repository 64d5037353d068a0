//! The engine under store faults and slow bodies: transient errors are retried where that is safe,
//! a mark that never lands is its own outcome, a heartbeat keeps a slow body's claim.
//!
//! `Flaky` wraps a real `MemoryStore` and makes its next N claims or marks fail with a transient
//! error, as a contended database would; everything else is the real store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use idem::{
    Busy, Call, Claim, ClaimOutcome, ClaimRequest, IdemError, Limits, MemoryStore, Outcome, Record,
    Status, Store,
};

#[derive(Default)]
struct Flaky {
    inner: MemoryStore,
    failing_claims: AtomicU32,
    failing_marks: AtomicU32,
    marks_tried: AtomicU32,
}

fn take_one(counter: &AtomicU32) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn busy() -> IdemError {
    IdemError::busy(Busy::Locked, "database is locked")
}

#[async_trait]
impl Store for Flaky {
    fn backend(&self) -> &'static str {
        "flaky"
    }
    fn limits(&self) -> &Limits {
        self.inner.limits()
    }
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        if take_one(&self.failing_claims) {
            return Err(busy());
        }
        self.inner.claim(req).await
    }
    async fn complete(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
    ) -> Result<(), IdemError> {
        self.marks_tried.fetch_add(1, Ordering::SeqCst);
        if take_one(&self.failing_marks) {
            return Err(busy());
        }
        self.inner.complete(biz, key, claim, snapshot).await
    }
    async fn fail(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        self.marks_tried.fetch_add(1, Ordering::SeqCst);
        if take_one(&self.failing_marks) {
            return Err(busy());
        }
        self.inner.fail(biz, key, claim).await
    }
    async fn renew(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        self.inner.renew(biz, key, claim, lease).await
    }
    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        self.inner.load(biz, key).await
    }
    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        self.inner.sweep_expired(batch).await
    }
}

async fn call(store: &Flaky, key: &str, runs: &AtomicU32) -> (Result<u32, IdemError>, Outcome) {
    let (res, report) = idem::observe(
        Call::new("FAULT", key).run(store, async { Ok(runs.fetch_add(1, Ordering::SeqCst)) }),
    )
    .await;
    (res, report.unwrap().outcome)
}

#[tokio::test]
async fn a_transient_mark_failure_is_retried() {
    let (store, runs) = (Flaky::default(), AtomicU32::new(0));
    store.failing_marks.store(2, Ordering::SeqCst);
    let (res, outcome) = call(&store, "k", &runs).await;
    assert_eq!((res.unwrap(), outcome), (0, Outcome::Executed));
    assert_eq!(store.marks_tried.load(Ordering::SeqCst), 3);
    assert_eq!(
        store.load("FAULT", "k").await.unwrap().unwrap().status,
        Status::Succeeded
    );
    let (again, outcome) = call(&store, "k", &runs).await;
    assert_eq!((again.unwrap(), outcome), (0, Outcome::Replayed));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_mark_that_never_lands_is_its_own_outcome_and_keeps_the_claim() {
    let (store, runs) = (Flaky::default(), AtomicU32::new(0));
    store.failing_marks.store(100, Ordering::SeqCst);
    let (res, outcome) = call(&store, "k", &runs).await;
    let err = res.unwrap_err();
    assert!(
        matches!(
            err,
            IdemError::StoreBusy {
                reason: Busy::Locked,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert_eq!(outcome, Outcome::MarkFailed, "not counted as executed");
    assert!(
        store.marks_tried.load(Ordering::SeqCst) > 1,
        "it was retried"
    );
    // The claim still protects the key: a repeat is told "in progress", the body does not run.
    store.failing_marks.store(0, Ordering::SeqCst);
    let (dup, outcome) = call(&store, "k", &runs).await;
    assert!(matches!(dup, Err(IdemError::InProgress { .. })), "{dup:?}");
    assert_eq!(outcome, Outcome::InProgress);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_transient_claim_failure_is_retried_and_a_persistent_one_is_retryable() {
    let (store, runs) = (Flaky::default(), AtomicU32::new(0));
    store.failing_claims.store(2, Ordering::SeqCst);
    let (res, outcome) = call(&store, "a", &runs).await;
    assert_eq!((res.unwrap(), outcome), (0, Outcome::Executed));

    store.failing_claims.store(100, Ordering::SeqCst);
    let (res, outcome) = call(&store, "b", &runs).await;
    let err = res.unwrap_err();
    assert!(err.is_retryable() && err.http_status() == 503, "{err:?}");
    assert_eq!(outcome, Outcome::Rejected);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "nothing ran for the refused claim"
    );
    assert!(store.load("FAULT", "b").await.unwrap().is_none());
}

/// A body slower than its lease keeps its claim with a heartbeat: every duplicate meanwhile is told
/// "in progress", and the body's result is stored. (Real time: lease 1.5 s, beat 0.2 s, body 3 s;
/// a beat would have to be 1.3 s late to lose the claim.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_keeps_a_slow_body_from_being_taken_over() {
    let store = Arc::new(MemoryStore::new());
    let lease = Duration::from_millis(1500);
    let slow = {
        let store = store.clone();
        tokio::spawn(async move {
            Call::new("BEAT", "k")
                .lease(lease)
                .heartbeat(Duration::from_millis(200))
                .run(&*store, async {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    Ok::<_, IdemError>("slow but healthy".to_owned())
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut refused = 0;
    while !slow.is_finished() {
        let dup: Result<String, IdemError> = Call::new("BEAT", "k")
            .lease(lease)
            .run(&*store, async { Ok("a second execution".to_owned()) })
            .await;
        match dup.as_deref() {
            Err(IdemError::InProgress { .. }) => refused += 1,
            Ok("slow but healthy") => break,
            other => panic!("the slow body lost its claim: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(slow.await.unwrap().unwrap(), "slow but healthy");
    assert!(refused >= 10, "duplicates during the body: {refused}");
}

#[tokio::test]
async fn a_heartbeat_must_be_shorter_than_the_lease() {
    let store = MemoryStore::new();
    let res: Result<u8, IdemError> = Call::new("BEAT", "x")
        .lease(Duration::from_secs(1))
        .heartbeat(Duration::from_secs(1))
        .run(&store, async { Ok(1) })
        .await;
    assert!(
        matches!(res, Err(IdemError::InvalidOptions { .. })),
        "{res:?}"
    );
    assert!(store.load("BEAT", "x").await.unwrap().is_none());
}

/// A transaction the database rolled back (a deadlock victim) runs again; other errors do not.
#[tokio::test]
async fn a_rolled_back_transaction_runs_again() {
    let runs = AtomicU32::new(0);
    let n = idem::retry_transaction(|| async {
        let run = runs.fetch_add(1, Ordering::SeqCst);
        if run < 2 {
            return Err(IdemError::busy(
                Busy::Deadlock,
                "Deadlock found when trying to get lock",
            ));
        }
        Ok(run)
    })
    .await
    .unwrap();
    assert_eq!(n, 2);
    let runs = AtomicU32::new(0);
    let res: Result<u32, IdemError> = idem::retry_transaction(|| async {
        runs.fetch_add(1, Ordering::SeqCst);
        Err(IdemError::busy(Busy::Locked, "locked"))
    })
    .await;
    assert!(res.is_err());
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "only a rolled-back transaction runs again"
    );
}
