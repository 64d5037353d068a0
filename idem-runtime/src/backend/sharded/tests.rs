//! The layout as processes read it: a planned move changes no routing whatever a process's list,
//! a finished one routes every list alike, and a process not given a shard refuses its keys.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::ShardedStore;
use crate::sharding::{Phase, Reshard};
use crate::{Call, IdemError, SqliteStore, Store};

async fn shards() -> (SqliteStore, SqliteStore, SqliteStore) {
    let mut made = Vec::new();
    for _ in 0..3 {
        let s = SqliteStore::in_memory().await.unwrap();
        s.migrate().await.unwrap();
        made.push(s);
    }
    let c = made.pop().unwrap();
    let b = made.pop().unwrap();
    (made.pop().unwrap(), b, c)
}

/// Calls keys `0..n` on `store`; how many bodies ran.
async fn call_all<S: Store>(store: &S, n: usize) -> u32 {
    let ran = Arc::new(AtomicU32::new(0));
    for i in 0..n {
        let ran = ran.clone();
        let answer: Result<String, IdemError> = Call::new("PAY", &format!("k{i}"))
            .run(store, async move {
                ran.fetch_add(1, Ordering::Relaxed);
                Ok(format!("r{i}"))
            })
            .await;
        assert_eq!(answer.unwrap(), format!("r{i}"));
    }
    ran.load(Ordering::Relaxed)
}

#[tokio::test]
async fn a_planned_move_changes_no_routing_whatever_the_list() {
    let (a, b, c) = shards().await;
    let two = ShardedStore::new([a.clone(), b.clone()]).unwrap();
    assert_eq!(call_all(&two, 200).await, 200);
    let three = ShardedStore::new([a.clone(), b.clone(), c.clone()]).unwrap();
    let planned = Reshard::new(&two, &three)
        .plan_only()
        .run(|_| {})
        .await
        .unwrap();
    assert_eq!(planned.phase, Some(Phase::Planned));
    // Another order and a shard more: the layout routes, so every key replays.
    let reordered = ShardedStore::new([c, b, a]).unwrap();
    assert_eq!(call_all(&reordered, 200).await, 0, "no key ran again");
    let layout = reordered.layout().expect("read on the first call");
    assert_eq!((layout.step, layout.phase), (1, Phase::Planned));
    // Without the layout, the reordered list would have routed most keys elsewhere.
    let bare = ShardedStore::new([SqliteStore::in_memory().await.unwrap()]).unwrap();
    assert!(bare.layout().is_none());
}

#[tokio::test]
async fn after_a_move_every_list_routes_alike_and_a_missing_shard_is_refused() {
    let (a, b, c) = shards().await;
    let two = ShardedStore::new([a.clone(), b.clone()]).unwrap();
    assert_eq!(call_all(&two, 300).await, 300);
    let three = ShardedStore::new([a.clone(), b.clone(), c.clone()]).unwrap();
    let done = Reshard::new(&two, &three).run(|_| {}).await.unwrap();
    assert_eq!(done.phase, Some(Phase::Done));
    assert!(
        done.copied > 50,
        "about a third of 300 moved: {}",
        done.copied
    );
    // Any order of the three shards replays every key.
    let reordered = ShardedStore::new([b.clone(), c.clone(), a.clone()]).unwrap();
    assert_eq!(call_all(&reordered, 300).await, 0, "no key ran again");
    // The old list alone: keys that moved to `c` are refused, the others served.
    let old = ShardedStore::new([a, b]).unwrap();
    let (mut refused, mut served) = (0, 0);
    for i in 0..300 {
        let key = format!("k{i}");
        let answer: Result<String, IdemError> = Call::new("PAY", &key)
            .run(&old, async { panic!("{key} ran again") })
            .await;
        match answer {
            Ok(_) => served += 1,
            Err(IdemError::StoreUnavailable { source }) => {
                assert!(source.to_string().contains("not given"), "{source}");
                refused += 1;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(refused, done.copied, "exactly the moved keys are refused");
    assert_eq!(served + refused, 300);
    // Run again, the reshard has nothing left to do.
    let again = Reshard::new(&two, &three).run(|_| {}).await.unwrap();
    assert_eq!((again.step, again.copied), (done.step, 0));
}

#[tokio::test]
async fn a_reshard_from_a_list_the_keys_are_not_routed_over_is_refused() {
    let (a, b, c) = shards().await;
    let two = ShardedStore::new([a.clone(), b.clone()]).unwrap();
    let three = ShardedStore::new([a.clone(), b.clone(), c.clone()]).unwrap();
    Reshard::new(&two, &three)
        .plan_only()
        .run(|_| {})
        .await
        .unwrap();
    let other = ShardedStore::new([a, c]).unwrap();
    let err = Reshard::new(&other, &two).run(|_| {}).await.unwrap_err();
    assert!(
        matches!(&err, IdemError::InvalidOptions { reason } if reason.contains("finish that reshard first")),
        "{err:?}"
    );
    for bad in [0, crate::MAX_BATCH + 1] {
        assert!(Reshard::new(&two, &three).batch(bad).is_err());
    }
    for bad in [
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(3601),
    ] {
        assert!(Reshard::new(&two, &three).settle(bad).is_err());
    }
}
