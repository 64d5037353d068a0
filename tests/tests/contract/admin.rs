//! What an operator does by hand (`idem::admin`, the `idem` CLI), on every store: counts per
//! business type and status; a release that ends a dead holder's lease so the next call takes it
//! over and asks recover (one effect, the recovered result); a mark of failure that moves an ended
//! lease to FAILED so the next call runs; both refuse a success, a live lease and a bad reason,
//! and, racing a takeover, never leave a FAILED record under the new holder's fence; stuck records
//! across business types; the sweep loop.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::admin::{self, Release, Released};
use idem::{
    Call, IdemError, Store, TestClock,
    store::{Acquired, ClaimOutcome, Status, StatusCount},
};
use tokio::sync::Barrier;

use super::{Effects, Subject, TTL, acquire, biz, pay, req, secs};

/// The store's clock as the test moves it: this machine's clock (every store under test runs
/// here) plus the test clock's offset.
fn now_ms(clock: &TestClock) -> i64 {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    wall + clock.offset().as_millis() as i64
}

fn why(reason: &str) -> Release<'_> {
    Release {
        reason,
        force: false,
    }
}

/// The counts of `bizes` only (a server's table may hold other tests' records).
async fn counts_of(store: &dyn Store, bizes: &[&String]) -> Vec<(String, Status, u64)> {
    store
        .stats()
        .await
        .unwrap()
        .into_iter()
        .filter(|c| bizes.contains(&&c.biz))
        .map(
            |StatusCount {
                 biz,
                 status,
                 records,
                 ..
             }| (biz, status, records),
        )
        .collect()
}

/// HTTP layer records (whose fingerprint keeps their method and route before its digest) are
/// counted per route; every other record has no route.
pub async fn stats_count_layer_records_per_route(s: Subject) {
    let store = s.store;
    let b = biz("stats_route");
    for (key, fp) in [
        ("r1", "POST /orders/{id} aa01"),
        ("r2", "POST /orders/{id} aa02"),
        ("r3", "PUT /carts aa03"),
        ("r4", "aa04"),
    ] {
        let mut r = req(&b, key, secs(10));
        r.fingerprint = Some(fp);
        acquire(&*store, &r).await;
    }
    let counts: Vec<(Option<String>, Status, u64)> = store
        .stats()
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c.biz == b)
        .map(|c| (c.origin, c.status, c.records))
        .collect();
    assert_eq!(
        counts,
        [
            (None, Status::Processing, 1),
            (Some("POST /orders/{id}".to_owned()), Status::Processing, 2),
            (Some("PUT /carts".to_owned()), Status::Processing, 1),
        ]
    );
}

pub async fn stats_count_records_per_biz_and_status(s: Subject) {
    let (store, clock) = (s.store, s.clock);
    let (a, b) = (biz("stats_a"), biz("stats_b"));
    assert_eq!(counts_of(&*store, &[&a, &b]).await, []);
    for key in ["s1", "s2", "s3"] {
        let (c, _) = acquire(&*store, &req(&a, key, secs(10))).await;
        store
            .complete(&a, key, &c, b"{\"Ok\":1}", TTL)
            .await
            .unwrap();
    }
    let (c, _) = acquire(&*store, &req(&a, "f1", secs(10))).await;
    store.fail(&a, "f1", &c).await.unwrap();
    acquire(&*store, &req(&a, "p1", secs(10))).await;
    acquire(&*store, &req(&a, "p2", secs(10))).await;
    acquire(&*store, &req(&b, "p1", secs(10))).await;
    // A success that lives 20 s: once they passed it is expired, and still counted until swept.
    let short = idem::store::ClaimRequest {
        ttl: secs(20),
        ..req(&b, "short", secs(10))
    };
    let (c, _) = acquire(&*store, &short).await;
    store
        .complete(&b, "short", &c, b"{\"Ok\":2}", secs(20))
        .await
        .unwrap();
    let want = vec![
        (a.clone(), Status::Processing, 2),
        (a.clone(), Status::Succeeded, 3),
        (a.clone(), Status::Failed, 1),
        (b.clone(), Status::Processing, 1),
        (b.clone(), Status::Succeeded, 1),
    ];
    assert_eq!(
        counts_of(&*store, &[&a, &b]).await,
        want,
        "sorted by biz, then status"
    );
    clock.advance(secs(21));
    assert_eq!(
        counts_of(&*store, &[&a, &b]).await,
        want,
        "an expired record counts until it is swept"
    );
    let mut seen = Vec::new();
    let swept = admin::sweep(&*store, 1, |total| seen.push(total))
        .await
        .unwrap();
    assert!(swept >= 1, "swept {swept}");
    assert_eq!(
        seen.last(),
        Some(&swept),
        "progress ends at the total: {seen:?}"
    );
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    assert_eq!(
        admin::sweep(&*store, 10, |_| ()).await.unwrap(),
        0,
        "nothing left"
    );
    assert_eq!(
        counts_of(&*store, &[&b]).await,
        [(b.clone(), Status::Processing, 1)],
        "the swept success is gone; the PROCESSING one (lease ended, TTL not) stays"
    );
}

/// The failure a release is for: a holder had its effect (the payment row), then died before its
/// mark. The release ends its lease, the retry takes over and asks recover, which finds the
/// effect: one effect, and the caller gets the recovered result.
pub async fn release_ends_the_lease_and_the_retry_recovers_the_effect(s: Subject) {
    let (store, clock, fx, biz) = (s.store, s.clock, Effects::new().await, biz("release_rec"));
    let (dead, _) = acquire(&*store, &req(&biz, "o", secs(10))).await;
    fx.record(&biz, "o").await; // its effect; then the process died before the mark
    clock.advance(secs(11));
    let done = admin::release_at(
        &*store,
        &biz,
        "o",
        why("INC-1: the worker died mid-call"),
        now_ms(&clock),
    )
    .await
    .unwrap();
    let Released::LeaseEnded { before } = &done else {
        panic!("expected the lease ended, got {done:?}");
    };
    assert!(done.changed() && done.released());
    assert_eq!(
        (before.status, before.fence),
        (Status::Processing, dead.fence)
    );
    let rec = store.load(&biz, "o").await.unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.fence),
        (Status::Processing, dead.fence),
        "still PROCESSING under the dead holder's fence: never FAILED"
    );
    if store.stuck(&biz, 10).await.is_ok() {
        let stuck = store.stuck(&biz, 10).await.unwrap();
        assert_eq!(stuck.len(), 1, "the reconciler sees it: {stuck:?}");
    }
    let asked = std::sync::atomic::AtomicU32::new(0);
    let (got, report) = idem::metrics::observe(
        Call::new(biz.clone(), "o")
            .recover(|| async {
                asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // The business's own record: the payment is there.
                Ok(if fx.count(&biz, "o").await > 0 {
                    Some(super::Receipt {
                        order: "o".to_owned(),
                        amount: 5,
                        serial: 0,
                    })
                } else {
                    None
                })
            })
            .run(&*store, pay(&fx, &biz, "o", 5)),
    )
    .await;
    assert_eq!(got.unwrap().amount, 5);
    assert_eq!(report.unwrap().outcome, idem::metrics::Outcome::Recovered);
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(fx.count(&biz, "o").await, 1, "one effect");
    // The dead holder's mark, if it ever came, is refused: the retry took the record over.
    let late = store.complete(&biz, "o", &dead, b"{\"Ok\":0}", TTL).await;
    assert!(matches!(late, Err(IdemError::LeaseLost { .. })), "{late:?}");
    let again = Call::new(biz.clone(), "o")
        .run(&*store, pay(&fx, &biz, "o", 5))
        .await
        .unwrap();
    assert_eq!(
        (again.amount, again.serial),
        (5, 0),
        "repeats replay the recovered result"
    );
    assert_eq!(fx.count(&biz, "o").await, 1);
}

pub async fn mark_failed_moves_an_ended_lease_to_failed_and_the_next_call_runs(s: Subject) {
    let (store, clock, fx, biz) = (s.store, s.clock, Effects::new().await, biz("release"));
    let (stale, _) = acquire(&*store, &req(&biz, "o", secs(10))).await;
    clock.advance(secs(11));
    let done = admin::mark_failed_at(
        &*store,
        &biz,
        "o",
        why("INC-1: the worker died"),
        now_ms(&clock),
    )
    .await
    .unwrap();
    let Released::Failed { before } = &done else {
        panic!("expected a release, got {done:?}");
    };
    assert!(done.changed() && done.released());
    assert_eq!(
        (before.status, before.attempt, before.fence),
        (Status::Processing, stale.attempt, stale.fence)
    );
    let rec = store.load(&biz, "o").await.unwrap().unwrap();
    assert_eq!((rec.status, rec.fence), (Status::Failed, stale.fence));
    // The old holder, if it wakes up, cannot mark the released record.
    let late = store.complete(&biz, "o", &stale, b"{\"Ok\":0}", TTL).await;
    assert!(matches!(late, Err(IdemError::LeaseLost { .. })), "{late:?}");
    // Released again: already FAILED, nothing written.
    let again = admin::mark_failed_at(&*store, &biz, "o", why("again"), now_ms(&clock))
        .await
        .unwrap();
    assert!(
        matches!(&again, Released::AlreadyFailed { record } if *record == rec),
        "{again:?}"
    );
    assert!(!again.changed() && again.released());
    let (ran, report) =
        idem::metrics::observe(Call::new(biz.clone(), "o").run(&*store, pay(&fx, &biz, "o", 9)))
            .await;
    assert_eq!(ran.unwrap().amount, 9);
    let report = report.unwrap();
    assert_eq!(
        (report.outcome, report.attempt),
        (idem::metrics::Outcome::Executed, stale.attempt + 1),
        "the next call runs again"
    );
    assert_eq!(fx.count(&biz, "o").await, 1);
}

pub async fn release_refuses_a_success_a_live_lease_an_absent_key_and_a_bad_reason(s: Subject) {
    let (store, clock, fx, biz) = (s.store, s.clock, Effects::new().await, biz("release_no"));
    let now = || now_ms(&clock);
    // A success: never touched.
    Call::new(biz.clone(), "done")
        .run(&*store, pay(&fx, &biz, "done", 1))
        .await
        .unwrap();
    let rec = store.load(&biz, "done").await.unwrap().unwrap();
    for force in [false, true] {
        let opts = Release {
            reason: "wrong key",
            force,
        };
        let got = admin::release_at(&*store, &biz, "done", opts, now())
            .await
            .unwrap();
        assert!(
            matches!(&got, Released::Succeeded { record } if *record == rec),
            "{got:?}"
        );
        assert!(!got.changed());
    }
    assert_eq!(
        store.load(&biz, "done").await.unwrap().unwrap(),
        rec,
        "unchanged"
    );
    // A live lease: refused without force.
    let (held, _) = acquire(&*store, &req(&biz, "live", secs(30))).await;
    let before = store.load(&biz, "live").await.unwrap().unwrap();
    let got = admin::release_at(&*store, &biz, "live", why("impatient"), now())
        .await
        .unwrap();
    match &got {
        Released::LeaseLive { record, remaining } => {
            assert_eq!(record, &before);
            assert!(
                *remaining <= secs(30) && *remaining > secs(20),
                "{remaining:?}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        store.load(&biz, "live").await.unwrap().unwrap(),
        before,
        "unchanged"
    );
    // A bad reason is refused before anything is read or written, even with force.
    for reason in ["", "   ", "two\nlines", "a\u{7}bell", &"x".repeat(201)] {
        let opts = Release {
            reason,
            force: true,
        };
        let got = admin::release_at(&*store, &biz, "live", opts, now()).await;
        assert!(
            matches!(got, Err(IdemError::InvalidOptions { .. })),
            "{reason:?}: {got:?}"
        );
    }
    assert_eq!(
        store.load(&biz, "live").await.unwrap().unwrap(),
        before,
        "unchanged"
    );
    // Neither does a mark of failure.
    let got = admin::mark_failed_at(&*store, &biz, "live", why("impatient"), now())
        .await
        .unwrap();
    assert!(matches!(got, Released::LeaseLive { .. }), "{got:?}");
    // With force its lease ends; once the next call took it over, the holder's mark is refused.
    let forced = Release {
        reason: &"y".repeat(200),
        force: true,
    };
    let got = admin::release_at(&*store, &biz, "live", forced, now())
        .await
        .unwrap();
    assert!(matches!(got, Released::LeaseEnded { .. }), "{got:?}");
    let (_, how) = acquire(&*store, &req(&biz, "live", secs(30))).await;
    assert_eq!(how, Acquired::TakeOver, "taken over at once");
    let late = store
        .complete(&biz, "live", &held, b"{\"Ok\":1}", TTL)
        .await;
    assert!(matches!(late, Err(IdemError::LeaseLost { .. })), "{late:?}");
    // A forced mark of failure refuses the holder's mark at once.
    let (held, _) = acquire(&*store, &req(&biz, "live2", secs(30))).await;
    let got = admin::mark_failed_at(&*store, &biz, "live2", forced, now())
        .await
        .unwrap();
    assert!(matches!(got, Released::Failed { .. }), "{got:?}");
    let late = store
        .complete(&biz, "live2", &held, b"{\"Ok\":1}", TTL)
        .await;
    assert!(matches!(late, Err(IdemError::LeaseLost { .. })), "{late:?}");
    // No record.
    let got = admin::release_at(&*store, &biz, "absent", why("typo"), now())
        .await
        .unwrap();
    assert_eq!(got, Released::NotFound);
    assert!(
        store.load(&biz, "absent").await.unwrap().is_none(),
        "nothing created"
    );
}

/// Many trials, each an ended lease with a release (or a mark of failure) and a takeover let go at
/// once by a barrier: either the release won (the lease ended, or FAILED, under the old fence, and
/// the takeover then took it over, or ran as a retry) or the takeover did (the release refused,
/// nothing changed by it); never a FAILED record under the new holder's fence, and the new
/// holder's mark succeeds.
pub async fn a_release_racing_a_takeover_has_one_winner(s: Subject) {
    for mark_failed in [false, true] {
        race_a_takeover(
            Subject {
                store: s.store.clone(),
                clock: s.clock.clone(),
            },
            mark_failed,
        )
        .await;
    }
}

async fn race_a_takeover(s: Subject, mark_failed: bool) {
    let (store, clock, biz) = (s.store, s.clock, biz("release_race"));
    const TRIALS: usize = 40;
    let mut stale = Vec::new();
    for i in 0..TRIALS {
        stale.push(
            acquire(&*store, &req(&biz, &format!("k{i}"), secs(10)))
                .await
                .0,
        );
    }
    clock.advance(secs(11));
    let (mut released, mut lost, mut live) = (0, 0, 0);
    for (i, old) in stale.iter().enumerate() {
        let key = format!("k{i}");
        let barrier = Arc::new(Barrier::new(2));
        let release = {
            let (store, clock, biz, key, barrier) = (
                store.clone(),
                clock.clone(),
                biz.clone(),
                key.clone(),
                barrier.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                if mark_failed {
                    admin::mark_failed_at(&*store, &biz, &key, why("race"), now_ms(&clock)).await
                } else {
                    admin::release_at(&*store, &biz, &key, why("race"), now_ms(&clock)).await
                }
            })
        };
        let takeover = {
            let (store, biz, key, barrier) = (store.clone(), biz.clone(), key.clone(), barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                // 0, 1 or 2 round trips first, so the claim lands before the release's read,
                // between its read and its write, or after both, whatever the store's speed.
                for _ in 0..i % 3 {
                    store.load(&biz, &key).await.unwrap();
                }
                store.claim(&req(&biz, &key, secs(30))).await
            })
        };
        let (rel, mut took) = (
            release.await.unwrap().unwrap(),
            takeover.await.unwrap().unwrap(),
        );
        // A claim that read the store's clock before the release wrote (MariaDB: its statement
        // waited for the release's row lock) sees the ended lease a moment ahead, and is told to
        // come back then (a caller gets `InProgress` with that retry-after); its retry takes over.
        for _ in 0..10 {
            let ClaimOutcome::InProgress { retry_after } = took else {
                break;
            };
            assert!(
                retry_after <= Duration::from_millis(100),
                "{key}: the released lease ends at once, not in {retry_after:?}"
            );
            tokio::time::sleep(retry_after).await;
            took = store.claim(&req(&biz, &key, secs(30))).await.unwrap();
        }
        let ClaimOutcome::Acquired { claim: new, how } = took else {
            panic!("{key}: the takeover must get the record either way, got {took:?}");
        };
        assert!(new.fence > old.fence, "{key}");
        match &rel {
            Released::LeaseEnded { before } => {
                released += 1;
                assert_eq!(before.fence, old.fence, "{key}: ended under the old fence");
                assert_eq!(how, Acquired::TakeOver, "{key}: a takeover either way");
            }
            Released::Failed { before } => {
                released += 1;
                assert_eq!(
                    before.fence, old.fence,
                    "{key}: released under the old fence"
                );
                assert_eq!(
                    how,
                    Acquired::RetryAfterFailure,
                    "{key}: the claim came after"
                );
            }
            Released::LeaseLost { now } => {
                lost += 1;
                assert_eq!(how, Acquired::TakeOver, "{key}");
                let now = now.as_ref().expect("the takeover's record");
                assert_eq!(
                    (now.status, now.fence),
                    (Status::Processing, new.fence),
                    "{key}"
                );
            }
            Released::LeaseLive { record, .. } => {
                live += 1;
                assert_eq!(how, Acquired::TakeOver, "{key}");
                assert_eq!(
                    record.fence, new.fence,
                    "{key}: it read the takeover's record"
                );
            }
            other => panic!("{key}: {other:?}"),
        }
        let rec = store.load(&biz, &key).await.unwrap().unwrap();
        assert_eq!(
            (rec.status, rec.fence),
            (Status::Processing, new.fence),
            "{key}: never FAILED under the new holder's fence"
        );
        store
            .complete(&biz, &key, &new, b"{\"Ok\":\"new\"}", TTL)
            .await
            .unwrap_or_else(|e| panic!("{key}: the holder of the fence marks: {e}"));
        let late = store
            .complete(&biz, &key, old, b"{\"Ok\":\"old\"}", TTL)
            .await;
        assert!(
            matches!(late, Err(IdemError::LeaseLost { .. })),
            "{key}: {late:?}"
        );
        assert_eq!(
            store.load(&biz, &key).await.unwrap().unwrap().status,
            Status::Succeeded
        );
    }
    eprintln!(
        "release vs takeover: {released} released first, {lost} lost the race, {live} saw the takeover"
    );
}

/// `stuck_all`: the ended leases of every business type, oldest first; live and finished ones not.
pub async fn stuck_all_lists_ended_leases_across_business_types(s: Subject) {
    let (store, clock) = (s.store, s.clock);
    let (a, b) = (biz("stuck_all_a"), biz("stuck_all_b"));
    if let Err(IdemError::NotSupported { backend, .. }) = store.stuck(&a, 1).await {
        assert_eq!(
            backend, "redis-cluster",
            "only a cluster may lack the index"
        );
        return;
    }
    acquire(&*store, &req(&a, "x", secs(10))).await;
    clock.advance(secs(1));
    acquire(&*store, &req(&b, "y", secs(10))).await;
    acquire(&*store, &req(&b, "live", secs(600))).await;
    let (done, _) = acquire(&*store, &req(&a, "done", secs(10))).await;
    store
        .complete(&a, "done", &done, b"{\"Ok\":1}", TTL)
        .await
        .unwrap();
    clock.advance(secs(11));
    let mine = |all: Vec<idem::store::Record>| -> Vec<(String, String)> {
        all.into_iter()
            .filter(|r| r.biz == a || r.biz == b)
            .map(|r| (r.biz, r.key))
            .collect()
    };
    assert_eq!(
        mine(admin::stuck_all(&*store, 1000).await.unwrap()),
        [(a.clone(), "x".to_owned()), (b.clone(), "y".to_owned())]
    );
    // Where stuck_all looked: every business type with PROCESSING records, sorted, and none
    // that never had one.
    let listed = store.processing_biz_types().await.unwrap();
    assert!(listed.contains(&a) && listed.contains(&b), "{listed:?}");
    assert!(!listed.contains(&biz("stuck_all_never")), "{listed:?}");
    assert!(
        listed.windows(2).all(|w| w[0] < w[1]),
        "sorted, once each: {listed:?}"
    );
}
