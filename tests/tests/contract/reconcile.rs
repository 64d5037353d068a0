//! The reconciler on every store: 1,000 stuck records over two business types, resolved in
//! batches as their recover fns say; records under a live lease untouched; and a takeover racing
//! the reconciler never leaves a key both recovered and run again.
//!
//! The holders that died are claims taken directly on the store and never finished; the test
//! clock then moves past their lease. What "really happened" is the test's own table of effects.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use idem::{
    Call, IdemError, Reconciler,
    recovery::Reconciled,
    store::{Claim, Status},
};

use super::{Effects, Subject, acquire, biz, req, secs};

const PER_BIZ: usize = 500;

/// What the recover fns were asked and answered, by business type and key.
#[derive(Default)]
struct Asked {
    found: Mutex<HashSet<(String, String)>>,
    asked: Mutex<Vec<(String, String)>>,
}

/// How the "real business" answers for key number `i`: PAY found every even key, none of the odd
/// ones; SHIP found keys divisible by 3, cannot tell for keys that are 1 mod 3, and none else.
fn truth(kind: usize, i: usize) -> Result<Option<String>, String> {
    match kind {
        0 if i.is_multiple_of(2) => Ok(Some(format!("paid {i}"))),
        0 => Ok(None),
        _ if i.is_multiple_of(3) => Ok(Some(format!("shipped {i}"))),
        _ if i % 3 == 1 => Err("the warehouse does not answer".to_owned()),
        _ => Ok(None),
    }
}

fn index(key: &str) -> usize {
    key.trim_start_matches('k').parse().unwrap()
}

/// `stuck` itself: three claims with a 10 s lease (a second apart on the test clock), one
/// completed; 11 s later the two still PROCESSING are listed, oldest lease first, exactly as `load`
/// reads them; another business type's stuck record is not; a batch of 1 is the oldest.
pub async fn stuck_lists_ended_leases_oldest_first(s: Subject) {
    let (store, clock) = (s.store, s.clock);
    let (pay, refund, other) = (biz("stuck_pay"), biz("stuck_ref"), biz("stuck_none"));
    if let Err(IdemError::NotSupported { backend, .. }) = store.stuck(&pay, 1).await {
        assert_eq!(
            backend, "redis-cluster",
            "only a cluster may lack the index"
        );
        return;
    }
    let mut claims = Vec::new();
    for (biz, key) in [(&pay, "a"), (&pay, "b"), (&pay, "c"), (&refund, "r")] {
        claims.push(acquire(&*store, &req(biz, key, secs(10))).await.0);
        clock.advance(secs(1));
    }
    store
        .complete(&pay, "b", &claims[1], b"{\"Ok\":1}", secs(3600))
        .await
        .unwrap();
    assert_eq!(
        store.stuck(&pay, 10).await.unwrap(),
        [],
        "no lease ended yet"
    );
    clock.advance(secs(11));
    let stuck = store.stuck(&pay, 10).await.unwrap();
    let keys: Vec<&str> = stuck.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["a", "c"], "{stuck:?}");
    assert!(stuck[0].lease_until_ms < stuck[1].lease_until_ms);
    for (record, claim) in stuck.iter().zip([&claims[0], &claims[2]]) {
        assert_eq!(record.status, Status::Processing);
        assert_eq!((record.attempt, record.fence), (claim.attempt, claim.fence));
        let loaded = store.load(&pay, &record.key).await.unwrap().unwrap();
        assert_eq!(record, &loaded, "built as load builds it");
    }
    assert_eq!(store.stuck(&other, 10).await.unwrap(), []);
    assert_eq!(store.stuck("NUL\0", 10).await.unwrap(), []);
    assert_eq!(store.stuck(&pay, 1).await.unwrap(), stuck[..1]);
    assert_eq!(store.stuck(&refund, 10).await.unwrap().len(), 1);
}

pub async fn the_reconciler_resolves_stuck_records_in_batches(s: Subject) {
    let (store, clock) = (s.store, s.clock);
    let bizes = [biz("rec_pay"), biz("rec_ship")];
    // Can the store list stuck records at all?
    match store.stuck(&bizes[0], 1).await {
        Err(IdemError::NotSupported { backend, .. }) => {
            assert_eq!(
                backend, "redis-cluster",
                "only a cluster may lack the index"
            );
            eprintln!("skipped: {backend} cannot list stuck records");
            return;
        }
        other => assert!(other.unwrap().is_empty()),
    }
    let mut dead: Vec<(usize, String, Claim)> = Vec::new();
    for (kind, biz) in bizes.iter().enumerate() {
        for i in 0..PER_BIZ {
            let key = format!("k{i}");
            let (claim, _) = acquire(&*store, &req(biz, &key, secs(10))).await;
            dead.push((kind, key, claim));
        }
    }
    // A finished one and one under a long lease, in each business type: not stuck.
    let mut live = Vec::new();
    for biz in &bizes {
        let (done, _) = acquire(&*store, &req(biz, "finished", secs(10))).await;
        store
            .complete(biz, "finished", &done, b"{\"Ok\":\"done\"}", secs(3600))
            .await
            .unwrap();
        let (held, _) = acquire(&*store, &req(biz, "held", secs(600))).await;
        live.push(held);
    }
    clock.advance(secs(11));
    let listed = store.stuck(&bizes[0], 10).await.unwrap();
    assert_eq!(listed.len(), 10, "a batch of the stuck PAY records");
    assert!(
        listed
            .iter()
            .all(|r| r.status == Status::Processing && r.biz == bizes[0])
    );

    let asked = Arc::new(Asked::default());
    let answer = |kind: usize, biz: String| {
        let asked = asked.clone();
        move |key: String| {
            let asked = asked.clone();
            let biz = biz.clone();
            async move {
                asked.asked.lock().unwrap().push((biz.clone(), key.clone()));
                let found = truth(kind, index(&key));
                if let Ok(Some(_)) = &found {
                    asked.found.lock().unwrap().insert((biz, key));
                }
                found
            }
        }
    };
    let reconciler = Reconciler::new(store.clone(), 64)
        .recover(bizes[0].clone(), answer(0, bizes[0].clone()))
        .unwrap()
        .recover(bizes[1].clone(), answer(1, bizes[1].clone()))
        .unwrap();
    let done = reconciler.reconcile_once().await.unwrap();
    let expect = |kind: usize, want: fn(&Result<Option<String>, String>) -> bool| {
        (0..PER_BIZ).filter(|i| want(&truth(kind, *i))).count() as u64
    };
    let some = |r: &Result<Option<String>, String>| matches!(r, Ok(Some(_)));
    let none = |r: &Result<Option<String>, String>| matches!(r, Ok(None));
    let err = |r: &Result<Option<String>, String>| r.is_err();
    assert_eq!(
        done,
        Reconciled {
            found: 2 * PER_BIZ as u64,
            succeeded: expect(0, some) + expect(1, some),
            failed: expect(0, none) + expect(1, none),
            undecided: expect(1, err),
            skipped: 0,
        }
    );
    assert_eq!(
        asked.asked.lock().unwrap().len(),
        2 * PER_BIZ,
        "each asked once"
    );

    // Each record as its recover fn said; the dead claims are fenced out.
    for (kind, key, claim) in &dead {
        let biz = &bizes[*kind];
        let rec = store.load(biz, key).await.unwrap().unwrap();
        let want = match truth(*kind, index(key)) {
            Ok(Some(_)) => Status::Succeeded,
            Ok(None) => Status::Failed,
            Err(_) => Status::Processing,
        };
        assert_eq!(rec.status, want, "{biz} {key}");
        assert!(rec.fence > claim.fence, "{biz} {key}: a new fence");
        let late = store
            .complete(biz, key, claim, b"{\"Ok\":\"late\"}", secs(60))
            .await;
        assert!(matches!(late, Err(IdemError::LeaseLost { .. })), "{late:?}");
    }
    // A backfilled result replays as the call's own; a released one runs the body.
    let fx = Effects::new().await;
    let pay = |key: &'static str| {
        let fx = fx.clone();
        let biz = bizes[0].clone();
        async move {
            fx.record(&biz, key).await;
            Ok::<_, IdemError>(format!("ran {key}"))
        }
    };
    let replay: String = Call::new(bizes[0].clone(), "k0")
        .run(&*store, pay("k0"))
        .await
        .unwrap();
    assert_eq!(replay, "paid 0");
    let rerun: String = Call::new(bizes[0].clone(), "k1")
        .run(&*store, pay("k1"))
        .await
        .unwrap();
    assert_eq!(rerun, "ran k1");
    // Untouched: the finished record and the one under a live lease.
    for (biz, held) in bizes.iter().zip(&live) {
        let rec = store.load(biz, "held").await.unwrap().unwrap();
        assert_eq!(
            (rec.status, rec.fence),
            (Status::Processing, held.fence),
            "{biz}"
        );
        let rec = store.load(biz, "finished").await.unwrap().unwrap();
        assert_eq!(rec.status, Status::Succeeded, "{biz}");
    }
    // A second pass finds only the undecided ones, and asks again.
    let again = reconciler.reconcile_once().await.unwrap();
    assert_eq!(again.found, expect(1, err));
    assert_eq!(again.undecided, expect(1, err));
}

/// Callers take stuck records over while the reconciler resolves the same ones: for every key,
/// either the reconciler backfilled it or a caller ran the body, never both.
pub async fn a_takeover_racing_the_reconciler_has_one_winner(s: Subject) {
    let (store, clock, fx) = (s.store, s.clock, Effects::new().await);
    let biz = biz("rec_race");
    if let Err(IdemError::NotSupported { .. }) = store.stuck(&biz, 1).await {
        return;
    }
    const KEYS: usize = 100;
    for i in 0..KEYS {
        acquire(&*store, &req(&biz, &format!("k{i}"), secs(10))).await;
    }
    clock.advance(secs(11));
    let asked = Arc::new(Asked::default());
    let reconciler = {
        let (asked, biz) = (asked.clone(), biz.clone());
        Reconciler::new(store.clone(), 16)
            .recover(biz.clone(), move |key: String| {
                let (asked, biz) = (asked.clone(), biz.clone());
                async move {
                    tokio::task::yield_now().await;
                    asked.found.lock().unwrap().insert((biz, key.clone()));
                    Ok::<_, IdemError>(Some(format!("recovered {key}")))
                }
            })
            .unwrap()
    };
    let callers = {
        let (store, fx, biz) = (store.clone(), fx.clone(), biz.clone());
        tokio::spawn(async move {
            let mut answers = Vec::new();
            for i in (0..KEYS).rev() {
                let key = format!("k{i}");
                let (fx, b, k) = (fx.clone(), biz.clone(), key.clone());
                let got: Result<String, IdemError> = Call::new(biz.clone(), &key)
                    .run(&*store, async move {
                        fx.record(&b, &k).await;
                        Ok(format!("ran {k}"))
                    })
                    .await;
                answers.push((key, got));
            }
            answers
        })
    };
    let done = reconciler.reconcile_once().await.unwrap();
    let answers = callers.await.unwrap();
    let found = asked.found.lock().unwrap().clone();
    let mut ran = 0;
    for (key, got) in answers {
        let body_ran = fx.count(&biz, &key).await;
        assert!(body_ran <= 1, "{key} ran {body_ran} times");
        let recovered = found.contains(&(biz.clone(), key.clone()));
        assert!(
            !(recovered && body_ran == 1),
            "{key} was both recovered and run again"
        );
        ran += body_ran;
        let rec = store.load(&biz, &key).await.unwrap().unwrap();
        assert_eq!(rec.status, Status::Succeeded, "{key}");
        if let Ok(answer) = got {
            let want = if body_ran == 1 {
                format!("ran {key}")
            } else {
                format!("recovered {key}")
            };
            assert_eq!(answer, want, "{key}");
        }
    }
    assert_eq!(
        done.succeeded + ran as u64,
        KEYS as u64,
        "{done:?}, {ran} ran"
    );
}
