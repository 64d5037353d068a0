//! The retry storm: every key's business runs once under a burst of same-key callers.

use super::*;

/// `keys` keys × `callers` same-key callers, all released at once by a barrier, waiting for each
/// other: every key's business runs exactly once and every caller gets that one answer. Up to
/// 12,800 calls share a pool of 16 connections here, so a claim may wait longer for its
/// connection than the default store timeout (10 s): the calls are given as long as their wait.
pub async fn burst_executes_each_key_once(s: Subject, keys: usize, callers: usize) {
    let store = s.store;
    let (fx, biz) = (Effects::new().await, biz("burst"));
    let barrier = Arc::new(Barrier::new(keys * callers));
    let mut tasks = Vec::with_capacity(keys * callers);
    for k in 0..keys {
        for _ in 0..callers {
            let (store, fx, biz, barrier) =
                (store.clone(), fx.clone(), biz.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let key = format!("order-{k}");
                barrier.wait().await;
                let res = call(&biz, &key)
                    .fingerprint(&key)
                    .wait(Duration::from_secs(60))
                    .store_timeout(Duration::from_secs(60))
                    .run(&*store, pay(&fx, &biz, &key, k as u64))
                    .await;
                (k, res)
            }));
        }
    }
    let mut answers: Vec<Option<Receipt>> = vec![None; keys];
    for t in tasks {
        let (k, res) = t.await.unwrap();
        let receipt = res.unwrap_or_else(|e| panic!("key {k}: {e:?}"));
        match &answers[k] {
            None => answers[k] = Some(receipt),
            Some(first) => assert_eq!(
                first, &receipt,
                "key {k}: every caller must get the first answer"
            ),
        }
    }
    let (distinct, total) = fx.totals(&biz).await;
    assert_eq!(
        (distinct, total),
        (keys as i64, keys as i64),
        "executions must equal keys"
    );
}
