//! The engine under store faults and slow bodies: transient errors are retried where that is safe,
//! a mark that never lands is its own outcome, a heartbeat keeps a slow body's claim.
//!
//! `Flaky` wraps a real `MemoryStore` and makes its next N claims or marks fail with a transient
//! error, as a contended database would; everything else is the real store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use idem::metrics::Outcome;
use idem::{
    Call, IdemError, MemoryStore, Store,
    error::Busy,
    store::{Claim, ClaimOutcome, ClaimRequest, Limits, Record, Status},
};

#[derive(Default)]
struct Flaky {
    inner: MemoryStore,
    failing_claims: AtomicU32,
    failing_marks: AtomicU32,
    marks_tried: AtomicU32,
    /// Marks fail with "connection refused" until this moment (an outage).
    marks_down_until: std::sync::Mutex<Option<std::time::Instant>>,
    renewals: AtomicU32,
    /// When each renewal was sent, by tokio's clock.
    renewed_at: std::sync::Mutex<Vec<tokio::time::Instant>>,
    /// The next claim's reply comes back this late (a server slow to answer after a restart).
    claim_delay: std::sync::Mutex<Option<Duration>>,
    /// Marks and renewals never answer (a network gone silent under a held claim).
    silent_holder: std::sync::atomic::AtomicBool,
}

impl Flaky {
    /// Waits for ever while the holder's writes go unanswered.
    async fn silence(&self) {
        if self.silent_holder.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }

    /// Whether the next mark fails: one of the counted failures, or inside the outage.
    fn mark_fails(&self) -> Option<IdemError> {
        self.marks_tried.fetch_add(1, Ordering::SeqCst);
        if take_one(&self.failing_marks) {
            return Some(busy());
        }
        let down = *self.marks_down_until.lock().unwrap();
        down.filter(|until| std::time::Instant::now() < *until)
            .map(|_| IdemError::unavailable("connection refused"))
    }

    fn outage(&self, lasting: Duration) {
        *self.marks_down_until.lock().unwrap() = Some(std::time::Instant::now() + lasting);
    }
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
        let outcome = self.inner.claim(req).await;
        let delay = self.claim_delay.lock().unwrap().take();
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        outcome
    }
    async fn complete(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
    ) -> Result<(), IdemError> {
        self.silence().await;
        if let Some(e) = self.mark_fails() {
            return Err(e);
        }
        self.inner.complete(biz, key, claim, snapshot, ttl).await
    }
    async fn fail(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        self.silence().await;
        if let Some(e) = self.mark_fails() {
            return Err(e);
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
        self.silence().await;
        self.renewals.fetch_add(1, Ordering::SeqCst);
        self.renewed_at
            .lock()
            .unwrap()
            .push(tokio::time::Instant::now());
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
    let (res, report) = idem::metrics::observe(
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

async fn call_with(
    store: &Flaky,
    call: Call,
    runs: &AtomicU32,
) -> (Result<u32, IdemError>, Outcome) {
    let (res, report) =
        idem::metrics::observe(call.run(store, async { Ok(runs.fetch_add(1, Ordering::SeqCst)) }))
            .await;
    (res, report.unwrap().outcome)
}

/// A mark that keeps failing is tried for as long as the lease is live (far more than the four
/// tries of a transient claim), then the call gives up before the lease ends: the claim still
/// protects the key.
#[tokio::test]
async fn a_mark_that_never_lands_is_its_own_outcome_and_keeps_the_claim() {
    let (store, runs) = (Flaky::default(), AtomicU32::new(0));
    store.failing_marks.store(u32::MAX, Ordering::SeqCst);
    let lease = Duration::from_secs(1);
    let began = std::time::Instant::now();
    let (res, outcome) = call_with(&store, Call::new("FAULT", "k").lease(lease), &runs).await;
    // The heartbeat carried the failing mark for three leases, then let the lease run out.
    assert!(began.elapsed() >= lease * 3, "{:?}", began.elapsed());
    assert!(store.renewals.load(Ordering::SeqCst) >= 6);
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
    let tried = store.marks_tried.load(Ordering::SeqCst);
    assert!(tried > 4, "tried while the lease was live: {tried} tries");
    // It gave up while the lease was still live: a repeat is told "in progress", the body does
    // not run.
    store.failing_marks.store(0, Ordering::SeqCst);
    let (dup, outcome) = call_with(&store, Call::new("FAULT", "k").lease(lease), &runs).await;
    assert!(matches!(dup, Err(IdemError::InProgress { .. })), "{dup:?}");
    assert_eq!(outcome, Outcome::InProgress);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A mark failing 10 times in a row (the back-off's pauses grow to 250–750 ms) against a 2 s
/// lease and a beat every 600 ms: each renewal is sent when it is due, never after a pause that
/// ran past it, so the lease never runs short while the mark waits, and the mark lands. On
/// tokio's paused clock, so the gaps are exact.
#[tokio::test(start_paused = true)]
async fn renewals_keep_their_schedule_while_the_mark_backs_off() {
    let (store, runs) = (Flaky::default(), AtomicU32::new(0));
    store.failing_marks.store(10, Ordering::SeqCst);
    let every = Duration::from_millis(600);
    let call = Call::new("FAULT", "beats")
        .lease(Duration::from_secs(2))
        .heartbeat(every);
    let began = tokio::time::Instant::now();
    let (res, outcome) = call_with(&store, call, &runs).await;
    let ended = tokio::time::Instant::now();
    assert_eq!((res.unwrap(), outcome), (0, Outcome::Executed));
    assert_eq!(store.marks_tried.load(Ordering::SeqCst), 11);
    let mut beats = store.renewed_at.lock().unwrap().clone();
    assert!(!beats.is_empty(), "the mark waited {:?}", ended - began);
    beats.insert(0, began);
    // The timer wheel's resolution is a millisecond.
    let late = every + Duration::from_millis(2);
    for pair in beats.windows(2) {
        assert!(
            pair[1] - pair[0] <= late,
            "a renewal came {:?} after the last",
            pair[1] - pair[0]
        );
    }
    assert!(
        ended - beats[beats.len() - 1] <= late,
        "the lease ran short before the mark landed"
    );
}

/// A store that refuses connections for 1.5 s while a finished body marks (a database restart):
/// the mark keeps trying, the lease (5 s) is never at risk, and the call ends as a success that
/// repeats replay.
#[tokio::test]
async fn a_mark_waits_out_a_store_restart_within_the_lease() {
    let (store, runs) = (Flaky::default(), AtomicU32::new(0));
    let call = || Call::new("FAULT", "restart").lease(Duration::from_secs(5));
    let (res, report) = idem::metrics::observe(call().run(&store, async {
        store.outage(Duration::from_millis(1500));
        Ok::<_, IdemError>(runs.fetch_add(1, Ordering::SeqCst))
    }))
    .await;
    assert_eq!(
        (res.unwrap(), report.unwrap().outcome),
        (0, Outcome::Executed)
    );
    let tried = store.marks_tried.load(Ordering::SeqCst);
    assert!(tried > 4, "the mark outlasted four tries: {tried}");
    let rec = store.load("FAULT", "restart").await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Succeeded);
    let (again, outcome) = call_with(&store, call(), &runs).await;
    assert_eq!((again.unwrap(), outcome), (0, Outcome::Replayed));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// An outage longer than the lease (2 s against 1 s): the heartbeat keeps renewing between the
/// mark's tries (renewals reach the store, marks do not), so the claim stays ours and the mark
/// lands when the outage ends; without renewals the call would have given up at 0.9 s.
#[tokio::test]
async fn the_heartbeat_renews_while_the_mark_waits() {
    let (store, runs) = (Flaky::default(), AtomicU32::new(0));
    let call = || Call::new("FAULT", "long").lease(Duration::from_secs(1));
    let (res, report) = idem::metrics::observe(call().run(&store, async {
        store.outage(Duration::from_secs(2));
        Ok::<_, IdemError>(runs.fetch_add(1, Ordering::SeqCst))
    }))
    .await;
    assert_eq!(
        (res.unwrap(), report.unwrap().outcome),
        (0, Outcome::Executed)
    );
    assert!(
        store.renewals.load(Ordering::SeqCst) >= 2,
        "renewed during the outage"
    );
    let (again, outcome) = call_with(&store, call(), &runs).await;
    assert_eq!((again.unwrap(), outcome), (0, Outcome::Replayed));

    // With the heartbeat off the same outage outlasts the claim: the call gives up in time.
    let (res, outcome) = call_with(
        &store,
        Call::new("FAULT", "off")
            .lease(Duration::from_secs(1))
            .no_heartbeat(),
        &runs,
    )
    .await;
    assert_eq!(res.unwrap(), 1, "no outage yet: it ran and was marked");
    assert_eq!(outcome, Outcome::Executed);
    let (res, report) = idem::metrics::observe(
        Call::new("FAULT", "off2")
            .lease(Duration::from_secs(1))
            .no_heartbeat()
            .run(&store, async {
                store.outage(Duration::from_secs(2));
                Ok::<_, IdemError>(runs.fetch_add(1, Ordering::SeqCst))
            }),
    )
    .await;
    assert!(
        matches!(res, Err(IdemError::StoreUnavailable { .. })),
        "{res:?}"
    );
    assert_eq!(report.unwrap().outcome, Outcome::MarkFailed);
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
/// "in progress", and the body's result is stored. (Real time: lease 1.5 s, body 3 s; with the
/// default heartbeat, a third of the lease, a beat would have to be 1 s late to lose the claim.)
/// With the heartbeat off, a duplicate takes the claim over while the body still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_keeps_a_slow_body_from_being_taken_over() {
    for (beat, name) in [
        (Some(Duration::from_millis(200)), "given"),
        (None, "default"),
    ] {
        let store = Arc::new(MemoryStore::new());
        let lease = Duration::from_millis(1500);
        let slow = {
            let store = store.clone();
            tokio::spawn(async move {
                let call = Call::new("BEAT", "k").lease(lease);
                let call = match beat {
                    Some(every) => call.heartbeat(every),
                    None => call,
                };
                call.run(&*store, async {
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
                other => panic!("{name} heartbeat: the slow body lost its claim: {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(slow.await.unwrap().unwrap(), "slow but healthy");
        assert!(
            refused >= 10,
            "{name} heartbeat: duplicates during the body: {refused}"
        );
    }

    let store = Arc::new(MemoryStore::new());
    let lease = Duration::from_millis(300);
    let slow = {
        let store = store.clone();
        tokio::spawn(async move {
            Call::new("BEAT", "off")
                .lease(lease)
                .no_heartbeat()
                .run(&*store, async {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Ok::<_, IdemError>("slow".to_owned())
                })
                .await
        })
    };
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let dup: Result<String, IdemError> = Call::new("BEAT", "off")
        .lease(lease)
        .run(&*store, async { Ok("taken over".to_owned()) })
        .await;
    assert_eq!(dup.unwrap(), "taken over");
    assert!(
        matches!(slow.await.unwrap(), Err(IdemError::LeaseLost { .. })),
        "the slow body was taken over"
    );
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

/// A claim whose reply comes back after its lease ended (400 ms against 300 ms) while another
/// caller took the record over: the late holder confirms its claim with one fenced renewal before
/// running anything, finds it taken (`LeaseLost`), and its body never runs. One effect, not two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_comes_back_after_its_lease_runs_nothing_when_taken_over() {
    let store = Arc::new(Flaky::default());
    let runs = Arc::new(AtomicU32::new(0));
    let lease = Duration::from_millis(300);
    *store.claim_delay.lock().unwrap() = Some(Duration::from_millis(400));
    let late = {
        let (store, runs) = (store.clone(), runs.clone());
        tokio::spawn(async move {
            let (res, report) = idem::metrics::observe(
                Call::new("FAULT", "late").lease(lease).run(&*store, async {
                    Ok::<_, IdemError>(runs.fetch_add(1, Ordering::SeqCst))
                }),
            )
            .await;
            (res, report.unwrap().outcome)
        })
    };
    tokio::time::sleep(Duration::from_millis(320)).await;
    let (taker, outcome) = call_with(&store, Call::new("FAULT", "late").lease(lease), &runs).await;
    assert_eq!((taker.unwrap(), outcome), (0, Outcome::TakenOver));
    let (res, outcome) = late.await.unwrap();
    assert!(matches!(res, Err(IdemError::LeaseLost { .. })), "{res:?}");
    assert_eq!(outcome, Outcome::LeaseLost);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the late holder ran nothing"
    );

    // Late but not taken over: the renewal confirms the claim and the body runs once.
    *store.claim_delay.lock().unwrap() = Some(Duration::from_millis(400));
    let (res, outcome) = call_with(&store, Call::new("FAULT", "alone").lease(lease), &runs).await;
    assert_eq!((res.unwrap(), outcome), (1, Outcome::Executed));
}

/// A claim whose answer never comes ends the call at its store timeout, with a retryable
/// `StoreUnavailable`, and runs nothing; so does one at the default timeout when none is set.
#[tokio::test(start_paused = true)]
async fn a_claim_that_never_answers_ends_at_the_store_timeout() {
    let (store, runs) = (Flaky::default(), AtomicU32::new(0));
    for (key, timeout) in [
        ("unanswered", Some(Duration::from_secs(2))),
        ("default", None),
    ] {
        *store.claim_delay.lock().unwrap() = Some(Duration::from_secs(3600));
        let mut call = Call::new("FAULT", key);
        if let Some(timeout) = timeout {
            call = call.store_timeout(timeout);
        }
        let started = tokio::time::Instant::now();
        let (res, outcome) = call_with(&store, call, &runs).await;
        let took = started.elapsed();
        let e = res.unwrap_err();
        assert!(matches!(e, IdemError::StoreUnavailable { .. }), "{e:?}");
        assert!(
            e.is_retryable() && e.to_string().contains("store timeout"),
            "{e}"
        );
        assert_eq!(outcome, Outcome::Rejected);
        let timeout = timeout.unwrap_or(idem::store::DEFAULT_STORE_TIMEOUT);
        assert!(
            took >= timeout && took < timeout + Duration::from_millis(100),
            "{took:?}"
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "no claim answered, no body ran"
    );
}

/// A body that ran while its holder's writes go unanswered: the mark gives up at the store
/// timeout (long before the 30 s lease), the record stays PROCESSING (the key protected, the
/// effect possibly done), and the caller is told to retry. Also after the lease's safe end: a
/// lease of 1 s and a store timeout of 3 s end the mark at 3 s, not never.
#[tokio::test(start_paused = true)]
async fn a_mark_that_never_answers_ends_at_the_store_timeout() {
    let (store, runs) = (Flaky::default(), AtomicU32::new(0));
    for (key, lease, timeout) in [
        ("held", Duration::from_secs(30), Duration::from_secs(2)),
        ("past-lease", Duration::from_secs(1), Duration::from_secs(3)),
    ] {
        store.silent_holder.store(false, Ordering::SeqCst);
        let call = Call::new("FAULT", key)
            .lease(lease)
            .store_timeout(timeout)
            .no_heartbeat();
        let started = tokio::time::Instant::now();
        let (res, report) = idem::metrics::observe(call.run(&store, async {
            store.silent_holder.store(true, Ordering::SeqCst);
            Ok::<_, IdemError>(runs.fetch_add(1, Ordering::SeqCst))
        }))
        .await;
        let took = started.elapsed();
        let e = res.unwrap_err();
        assert!(
            matches!(e, IdemError::StoreUnavailable { .. }),
            "{key}: {e:?}"
        );
        assert_eq!(report.unwrap().outcome, Outcome::MarkFailed, "{key}");
        assert!(
            took >= timeout && took < timeout + Duration::from_millis(100),
            "{key}: {took:?}"
        );
        let rec = store.load("FAULT", key).await.unwrap().unwrap();
        assert_eq!(
            rec.status,
            Status::Processing,
            "{key}: the claim still protects the key"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A store timeout outside 1 ms ..= `MAX_DURATION` is refused before anything is written.
#[tokio::test]
async fn a_store_timeout_out_of_range_is_refused_before_anything_is_written() {
    let (store, runs) = (Flaky::default(), AtomicU32::new(0));
    for timeout in [Duration::ZERO, idem::MAX_DURATION + Duration::from_secs(1)] {
        let call = Call::new("FAULT", "range").store_timeout(timeout);
        let (res, _) = call_with(&store, call, &runs).await;
        let e = res.unwrap_err();
        assert!(matches!(e, IdemError::InvalidOptions { .. }), "{e:?}");
        assert!(e.to_string().contains("store timeout"), "{e}");
    }
    assert!(store.load("FAULT", "range").await.unwrap().is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// The attribute's `store_timeout` reaches the call.
#[idem::idempotent(biz = "FAULT", key = key, store = store, store_timeout = "1500ms")]
async fn bounded(store: &Flaky, key: &str, runs: &AtomicU32) -> Result<u32, IdemError> {
    Ok(runs.fetch_add(1, Ordering::SeqCst))
}

#[tokio::test(start_paused = true)]
async fn the_attribute_sets_the_store_timeout() {
    let (store, runs) = (Flaky::default(), AtomicU32::new(0));
    *store.claim_delay.lock().unwrap() = Some(Duration::from_secs(3600));
    let started = tokio::time::Instant::now();
    let e = bounded(&store, "attr", &runs).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(e, IdemError::StoreUnavailable { .. }), "{e:?}");
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_millis(1600),
        "{took:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// The inbox's store timeout bounds the calls its handler makes that set none, also a call built
/// before the handler runs; a call's own timeout still wins. A timed-out claim is requeued.
#[tokio::test(start_paused = true)]
async fn the_inbox_store_timeout_bounds_its_handlers_calls() {
    let (store, runs) = (Flaky::default(), AtomicU32::new(0));
    let inbox = idem::inbox::Inbox::builder()
        .store_timeout(Duration::from_millis(700))
        .build()
        .unwrap();
    for (key, own, expected) in [
        ("inbox", None, Duration::from_millis(700)),
        ("own", Some(Duration::from_secs(3)), Duration::from_secs(3)),
    ] {
        *store.claim_delay.lock().unwrap() = Some(Duration::from_secs(3600));
        let mut call = Call::new("FAULT", key);
        if let Some(own) = own {
            call = call.store_timeout(own);
        }
        let started = tokio::time::Instant::now();
        let handled = inbox
            .handle(
                None,
                call.run(&store, async {
                    Ok::<_, IdemError>(runs.fetch_add(1, Ordering::SeqCst))
                }),
            )
            .await;
        let took = started.elapsed();
        assert!(
            took >= expected && took < expected + Duration::from_millis(100),
            "{key}: {took:?}"
        );
        assert!(
            matches!(handled.verdict, idem::inbox::Verdict::Requeue { .. }),
            "{key}: {:?}",
            handled.verdict
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let refused = idem::inbox::Inbox::builder()
        .store_timeout(Duration::ZERO)
        .build();
    assert!(
        matches!(refused, Err(IdemError::InvalidOptions { .. })),
        "{refused:?}"
    );
}
