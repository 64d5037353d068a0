//! Bad input, refused before anything is written or keeping the claim: keys, business types,
//! results that cannot be stored, payloads that cannot be fingerprinted.

use super::*;

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
