//! TTL, lease and fence edges: leases that outlive their TTL, sweeps, late and repeated marks,
//! renewals, takeovers racing late completes and each other.

use super::*;

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

/// A mark, a fail or a renewal under a fence the record does not hold is refused (`LeaseLost`)
/// and changes nothing, with the clock where it was (no takeover moved it: a store may mark
/// differently while its test clock has not moved); the holder then marks as usual.
pub async fn a_mark_under_another_fence_changes_nothing(s: Subject) {
    let (store, biz) = (s.store, biz("other_fence"));
    let (held, _) = acquire(&*store, &req(&biz, "k", secs(10))).await;
    let before = store.load(&biz, "k").await.unwrap().unwrap();
    for fence in [held.fence.get() + 1, held.fence.get() - 1] {
        let other = Claim {
            attempt: held.attempt,
            fence: idem::store::Fence::new(fence),
        };
        let refused = [
            (
                "complete",
                store
                    .complete(&biz, "k", &other, b"{\"Ok\":\"other\"}", TTL)
                    .await,
            ),
            ("fail", store.fail(&biz, "k", &other).await),
            ("renew", store.renew(&biz, "k", &other, secs(10)).await),
        ];
        for (step, result) in refused {
            assert!(
                matches!(result, Err(IdemError::LeaseLost { .. })),
                "{step} under fence {fence}: {result:?}"
            );
        }
        assert_eq!(
            store.load(&biz, "k").await.unwrap().unwrap(),
            before,
            "a mark under fence {fence} changed the record"
        );
    }
    store
        .complete(&biz, "k", &held, b"{\"Ok\":1}", TTL)
        .await
        .unwrap();
    let rec = store.load(&biz, "k").await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.fence, rec.snapshot.as_deref()),
        (Status::Succeeded, held.fence, Some(&b"{\"Ok\":1}"[..]))
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

/// A record is never gone before the later of its expiry and its lease end, whatever sweeps,
/// result ttls, saved steps, releases and re-claims happen in between: a lease longer than its
/// ttl, a takeover, a release, a second takeover (attempt 3, which a recover fn would be asked
/// about), then a result kept for less than its record. Each sweep runs where the record is past
/// one of its two times but not the other; only the last one, past both, may delete it.
pub async fn a_record_outlives_its_expiry_and_lease_through_sweeps_and_reclaims(s: Subject) {
    let (store, clock, biz) = (s.store, s.clock, biz("outlives"));
    let sweep = || {
        let store = store.clone();
        async move {
            idem::Sweeper::new(store, 100).sweep_once().await.unwrap();
        }
    };
    let kept = |lease: u64, ttl: u64| ClaimRequest {
        ttl: secs(ttl),
        ..req(&biz, "k", secs(lease))
    };
    let status = |store: Arc<dyn Store>, biz: String| async move {
        store
            .load(&biz, "k")
            .await
            .unwrap()
            .map(|r| (r.status, r.attempt, r.steps))
    };

    // t=0: lease 10 s, ttl 30 s; a result with a short result ttl on another key beside it.
    let (first, _) = acquire(&*store, &kept(10, 30)).await;
    store.save_steps(&biz, "k", &first, b"[1]").await.unwrap();
    let (_long, _) = acquire(
        &*store,
        &ClaimRequest {
            ttl: secs(15),
            ..req(&biz, "long", secs(40))
        },
    )
    .await;
    let other = req(&biz, "other", secs(5));
    let (done, _) = acquire(&*store, &other).await;
    store
        .complete_keeping(&biz, "other", &done, b"{\"Ok\":1}", secs(60), secs(5))
        .await
        .unwrap();

    // t=11: the lease ended, the ttl runs to 30: a takeover with a lease (40 s) longer than a ttl
    // of 15 s; the record now lives to the lease's end (51).
    clock.advance(secs(11));
    sweep().await;
    let second = match store.claim(&kept(40, 15)).await.unwrap() {
        ClaimOutcome::Acquired { claim, how } => {
            assert_eq!((claim.attempt, how), (2, Acquired::TakeOver));
            claim
        }
        other => panic!("t=11: expected a takeover, got {other:?}"),
    };
    assert_eq!(
        status(store.clone(), biz.clone()).await,
        Some((Status::Processing, 2, Some(b"[1]".to_vec()))),
        "a takeover keeps the saved steps"
    );

    // t=27: the takeover's lease, and the record with it, live to 51; the key claimed at t=0 with
    // a lease (40 s) longer than its ttl (15 s) is past its ttl and under its lease. The sweep
    // spares both; a release ends the lease now and keeps the expiry (51).
    clock.advance(secs(16));
    sweep().await;
    assert!(
        store.load(&biz, "long").await.unwrap().is_some(),
        "a lease longer than its ttl keeps its record"
    );
    store
        .save_steps(&biz, "k", &second, b"[1,2]")
        .await
        .unwrap();
    store.release(&biz, "k", &second).await.unwrap();
    sweep().await;
    assert_eq!(
        status(store.clone(), biz.clone()).await,
        Some((Status::Processing, 2, Some(b"[1,2]".to_vec()))),
        "a released claim stays until its expiry"
    );

    // Still t=27: the third attempt is a takeover (a recover fn would be asked), not a new life.
    let third = match store.claim(&kept(10, 30)).await.unwrap() {
        ClaimOutcome::Acquired { claim, how } => {
            assert_eq!((claim.attempt, how), (3, Acquired::TakeOver));
            claim
        }
        other => panic!("t=27: expected the third attempt's takeover, got {other:?}"),
    };
    assert!(third.fence > second.fence && second.fence > first.fence);
    // It finishes with a result kept 5 s of a record kept to at least 57.
    store
        .complete_keeping(&biz, "k", &third, b"{\"Ok\":3}", secs(30), secs(5))
        .await
        .unwrap();

    // t=33: the result ttl passed: the sweep leaves a tombstone, which refuses the repeat.
    clock.advance(secs(6));
    sweep().await;
    assert!(
        matches!(
            store.claim(&kept(10, 30)).await.unwrap(),
            ClaimOutcome::ResultGone
        ),
        "t=33: the record is a tombstone until its expiry"
    );
    assert!(status(store.clone(), biz.clone()).await.is_some());

    // t=58: past the expiry and every lease: now, and only now, the record may go.
    clock.advance(secs(25));
    sweep().await;
    assert_eq!(status(store.clone(), biz.clone()).await, None);
    assert!(store.load(&biz, "long").await.unwrap().is_none());
    match store.claim(&kept(10, 30)).await.unwrap() {
        ClaimOutcome::Acquired { claim, how } => {
            assert_eq!((claim.attempt, how), (1, Acquired::Fresh));
            assert!(claim.fence > third.fence, "a fence never repeats");
        }
        other => panic!("t=58: expected a new life, got {other:?}"),
    }
}
