//! What the failover tests share: the call they make on each key, and their two verdicts, counted
//! in the independent effects table (`contract::Effects`), never by idem's counters. Include it
//! after `mod contract;`.

use std::time::Duration;

use idem::{Call, IdemError, Store};

use crate::contract::Effects;

/// The call for `key` on `store` with a store timeout of 1 s; its body records one side effect.
pub async fn pay(store: &dyn Store, fx: &Effects, key: &str) -> Result<String, IdemError> {
    let (fx, owned) = (fx.clone(), key.to_owned());
    Call::new("FAILOVER", key)
        .store_timeout(Duration::from_secs(1))
        .run(store, async move {
            fx.record("FAILOVER", &owned).await;
            Ok::<_, IdemError>(format!("receipt for {owned}"))
        })
        .await
}

/// Without the replica's acknowledgement: the 8 calls made while it was cut off were answered by
/// the primary alone, and the promoted replica ran each of them again; the 8 before replayed.
pub async fn forgotten(fx: &Effects, cut_off: &[Result<String, IdemError>]) {
    for (k, answer) in cut_off.iter().enumerate() {
        assert!(
            answer.is_ok(),
            "after-{k}: the primary answers alone: {answer:?}"
        );
    }
    for k in 0..8 {
        assert_eq!(
            fx.count("FAILOVER", &format!("before-{k}")).await,
            1,
            "before-{k}: replicated before the partition, replayed after the promotion"
        );
        assert_eq!(
            fx.count("FAILOVER", &format!("after-{k}")).await,
            2,
            "after-{k}: acknowledged by the primary alone, forgotten by the promoted replica: \
             the business ran again"
        );
    }
}

/// With writes waiting for the replica: the calls made while it was cut off answered
/// `StoreUnavailable` without running their bodies, and every key has one effect in the end.
pub async fn kept(fx: &Effects, cut_off: &[Result<String, IdemError>]) {
    for (k, answer) in cut_off.iter().enumerate() {
        assert!(
            matches!(answer, Err(IdemError::StoreUnavailable { .. })),
            "after-{k}: the replica never acknowledged the claim: {answer:?}"
        );
    }
    for k in 0..8 {
        for key in [format!("before-{k}"), format!("after-{k}")] {
            assert_eq!(
                fx.count("FAILOVER", &key).await,
                1,
                "{key}: one execution across the failover"
            );
        }
    }
}
