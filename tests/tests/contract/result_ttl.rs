//! A key unique for longer than its result is kept (`Call::result_ttl`): after the result ttl a
//! repeat is refused as `ResultExpired` and the body does not run, until the key's ttl ends; a
//! sweep shrinks the record to a tombstone; another payload is still a mismatch.

use idem::metrics::Outcome;
use idem::{Call, IdemError, store::Status};

use super::{Effects, PayError, Subject, biz, pay, secs};

/// ttl 60 s, result kept 10 s: the contract of a tombstone, step by step on the test clock.
pub async fn a_repeat_after_its_result_ttl_is_refused_until_the_ttl_ends(s: Subject) {
    let (store, clock, fx, biz) = (s.store, s.clock, Effects::new().await, biz("gone"));
    let kept = |amount: u64| {
        Call::new(biz.clone(), "o")
            .lease(secs(5))
            .ttl(secs(60))
            .result_ttl(secs(10))
            .fingerprint(&("o", amount))
    };
    let first = kept(100)
        .run(&*store, pay(&fx, &biz, "o", 100))
        .await
        .unwrap();
    let rec = store.load(&biz, "o").await.unwrap().unwrap();
    let until = rec
        .result_until_ms
        .expect("the mark records how long the result is kept");
    assert!(
        until < rec.expire_at_ms,
        "the result goes before the record: {rec:?}"
    );

    // Within the result ttl: a replay.
    clock.advance(secs(5));
    let (again, report) =
        idem::metrics::observe(kept(100).run(&*store, pay(&fx, &biz, "o", 100))).await;
    assert_eq!(again.unwrap(), first);
    assert_eq!(report.unwrap().outcome, Outcome::Replayed);

    // Past it: refused, the body does not run; another payload is still a mismatch.
    clock.advance(secs(6));
    let (late, report) =
        idem::metrics::observe(kept(100).run(&*store, pay(&fx, &biz, "o", 100))).await;
    assert!(
        matches!(late, Err(PayError::Idem(IdemError::ResultExpired))),
        "{late:?}"
    );
    assert_eq!(report.unwrap().outcome, Outcome::ResultExpired);
    let other = kept(999).run(&*store, pay(&fx, &biz, "o", 999)).await;
    assert!(
        matches!(other, Err(PayError::Idem(IdemError::PayloadMismatch))),
        "{other:?}"
    );
    // A call that asks nothing of the result's retention is refused alike: the record decides.
    let plain = Call::new(biz.clone(), "o")
        .fingerprint(&("o", 100u64))
        .run(&*store, pay(&fx, &biz, "o", 100))
        .await;
    assert!(
        matches!(plain, Err(PayError::Idem(IdemError::ResultExpired))),
        "{plain:?}"
    );
    assert_eq!(fx.count(&biz, "o").await, 1, "the body ran once");
    let counted: Vec<_> = store
        .stats()
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c.biz == biz)
        .map(|c| (c.status, c.records, c.tombstones))
        .collect();
    assert_eq!(
        counted,
        [(Status::Succeeded, 1, 1)],
        "stats count the tombstone"
    );

    // A sweep drops the result and keeps the tombstone (Redis dropped it already, when the
    // repeat met it): still refused.
    idem::Sweeper::new(store.clone(), 1_000)
        .sweep_once()
        .await
        .unwrap();
    let tomb = store.load(&biz, "o").await.unwrap().unwrap();
    assert_eq!(tomb.status, Status::Succeeded);
    assert_eq!(tomb.snapshot, None, "the result is gone: {tomb:?}");
    assert_eq!(tomb.result_until_ms, Some(0), "{tomb:?}");
    assert_eq!(
        (tomb.fingerprint.as_deref(), tomb.expire_at_ms, tomb.attempt),
        (rec.fingerprint.as_deref(), rec.expire_at_ms, rec.attempt),
        "the tombstone keeps the key's fingerprint, expiry and attempt"
    );
    let swept_again = kept(100).run(&*store, pay(&fx, &biz, "o", 100)).await;
    assert!(
        matches!(swept_again, Err(PayError::Idem(IdemError::ResultExpired))),
        "{swept_again:?}"
    );
    let other = kept(999).run(&*store, pay(&fx, &biz, "o", 999)).await;
    assert!(
        matches!(other, Err(PayError::Idem(IdemError::PayloadMismatch))),
        "{other:?}"
    );
    assert_eq!(fx.count(&biz, "o").await, 1);

    // Past the ttl the key is free again: a new life, whose result is kept afresh.
    clock.advance(secs(50));
    let (fresh, report) =
        idem::metrics::observe(kept(100).run(&*store, pay(&fx, &biz, "o", 100))).await;
    assert_ne!(fresh.unwrap(), first, "a new life runs the body");
    assert_eq!(report.unwrap().outcome, Outcome::Executed);
    assert_eq!(fx.count(&biz, "o").await, 2);
    let reborn = store.load(&biz, "o").await.unwrap().unwrap();
    assert!(reborn.snapshot.is_some() && reborn.result_until_ms.unwrap() > 0);
    let replay = kept(100).run(&*store, pay(&fx, &biz, "o", 100)).await;
    assert!(replay.is_ok(), "{replay:?}");
    assert_eq!(fx.count(&biz, "o").await, 2);
}

/// Without a result ttl, or with one as long as the ttl, the result lives as long as the record
/// (no `result_until`); one longer than the ttl, or under 1 ms, is refused before anything is
/// written.
pub async fn a_result_ttl_is_checked_and_the_default_keeps_the_result(s: Subject) {
    let (store, clock, fx, biz) = (s.store, s.clock, Effects::new().await, biz("gone_opts"));
    for (key, call) in [
        ("plain", Call::new(biz.clone(), "plain").ttl(secs(60))),
        (
            "as_long",
            Call::new(biz.clone(), "as_long")
                .ttl(secs(60))
                .result_ttl(secs(60)),
        ),
    ] {
        call.run(&*store, pay(&fx, &biz, key, 1)).await.unwrap();
        let rec = store.load(&biz, key).await.unwrap().unwrap();
        assert_eq!(rec.result_until_ms, None, "{key}: {rec:?}");
    }
    clock.advance(secs(59));
    for key in ["plain", "as_long"] {
        let again = Call::new(biz.clone(), key)
            .ttl(secs(60))
            .run(&*store, pay(&fx, &biz, key, 1))
            .await;
        assert!(again.is_ok(), "{key}: {again:?}");
        assert_eq!(fx.count(&biz, key).await, 1, "{key} replays");
    }
    for (key, result_ttl) in [("longer", secs(61)), ("zero", secs(0))] {
        let refused = Call::new(biz.clone(), key)
            .ttl(secs(60))
            .result_ttl(result_ttl)
            .run(&*store, pay(&fx, &biz, key, 1))
            .await;
        match refused {
            Err(PayError::Idem(IdemError::InvalidOptions { reason })) => {
                assert!(reason.contains("result ttl"), "{reason}")
            }
            other => panic!("{key}: expected InvalidOptions, got {other:?}"),
        }
        assert!(store.load(&biz, key).await.unwrap().is_none(), "{key}");
        assert_eq!(fx.count(&biz, key).await, 0, "{key}");
    }
}
