//! The decision table: what a claim meets (nothing, a success, a failure, a live or ended
//! lease, another payload, an expired record) and what the caller gets, written first and read
//! first.

use super::*;

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
        a_repeat_after_its_result_ttl_is_refused_until_the_ttl_ends,
        a_batch_claim_decides_each_key_as_a_claim_would,
        a_batch_of_new_keys_is_claimed_then_replayed
    );
    turned_to_read_first(&*s.store).await;
    burst_executes_each_key_once(again(&s), 8, 16).await;
}

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
