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

/// A reshard stopped while it waited for a holder from before the move, run again after the
/// holder marked its old shard: the new shard ends with the holder's result, nothing runs again.
#[tokio::test]
async fn a_reshard_stopped_while_it_waits_for_a_holder_goes_on_when_run_again() {
    use crate::store::{ClaimOutcome, ClaimRequest};
    use std::time::Duration;
    let (a, b, c) = shards().await;
    let two = ShardedStore::new([a.clone(), b.clone()]).unwrap();
    let three = ShardedStore::new([a.clone(), b.clone(), c.clone()]).unwrap();
    let key = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| super::route::shard("PAY", k, 3) == 2)
        .unwrap();
    let req = ClaimRequest {
        biz: "PAY",
        key: &key,
        fingerprint: None,
        lease: Duration::from_secs(8),
        ttl: Duration::from_secs(3600),
    };
    let ClaimOutcome::Acquired { claim, .. } = two.claim(&req).await.unwrap() else {
        panic!("a fresh key")
    };
    let (waiting, mut told) = tokio::sync::mpsc::unbounded_channel();
    let (from, to) = (two.clone(), three.clone());
    let first = tokio::spawn(async move {
        Reshard::new(&from, &to)
            .run(|p| {
                if p.waiting > 0 {
                    let _ = waiting.send(());
                }
            })
            .await
    });
    told.recv().await.expect("the tool waits for the holder");
    first.abort();
    // The holder marks its old shard after the tool stopped.
    two.complete(
        "PAY",
        &key,
        &claim,
        br#"{"Ok":"paid"}"#,
        Duration::from_secs(3600),
    )
    .await
    .unwrap();
    let done = Reshard::new(&two, &three).run(|_| {}).await.unwrap();
    assert_eq!(done.phase, Some(Phase::Done));
    let answer: Result<String, IdemError> = Call::new("PAY", &key)
        .run(&three, async { panic!("{key} ran again") })
        .await;
    assert_eq!(answer.unwrap(), "paid");
    let on_c = c.load("PAY", &key).await.unwrap().unwrap();
    assert_eq!(on_c.status, crate::Status::Succeeded);
}

/// Writes the layout's steps up to `phase` for a move from `from` to `to`, as the tool does but
/// without its waits, and returns the first key that moves from the second shard to the third.
async fn steps_to(phase: Phase, from: &[&SqliteStore], to: &[&SqliteStore]) -> String {
    use super::layout::{self, Layout};
    let ids = |list: &[&SqliteStore]| {
        let list: Vec<SqliteStore> = list.iter().map(|s| (*s).clone()).collect();
        async move {
            let mut ids = Vec::new();
            for s in &list {
                ids.push(layout::ensure_id(s).await.unwrap());
            }
            ids
        }
    };
    let (from_ids, to_ids) = (ids(from).await, ids(to).await);
    let phases = [Phase::Planned, Phase::DualOld, Phase::DualNew, Phase::Done];
    for (i, p) in phases.iter().take_while(|p| **p <= phase).enumerate() {
        let step = Layout {
            step: i as u64 + 1,
            phase: *p,
            from: from_ids.clone(),
            to: to_ids.clone(),
        };
        for s in to {
            layout::write_once(
                *s,
                layout::LAYOUT_BIZ,
                &layout::step_key(step.step),
                &step.encode(),
            )
            .await
            .unwrap();
        }
    }
    (0..)
        .map(|i| format!("k{i}"))
        .find(|k| {
            super::route::shard("PAY", k, from.len()) == 1 && super::route::shard("PAY", k, 3) == 2
        })
        .unwrap()
}

/// A moving key's claim on both shards, whose claim on the new shard was taken over after a
/// stall: its renewal is refused (the new shard's callers may already run), though the old
/// shard, which it renews first, still takes it.
#[tokio::test]
async fn a_pair_renews_only_when_both_shards_take_it() {
    use crate::store::{Acquired, ClaimOutcome, ClaimRequest};
    use std::time::Duration;
    let (a, b, c) = shards().await;
    let key = steps_to(Phase::DualOld, &[&a, &b], &[&a, &b, &c]).await;
    let three = ShardedStore::new([a.clone(), b.clone(), c.clone()]).unwrap();
    let req = ClaimRequest {
        biz: "PAY",
        key: &key,
        fingerprint: None,
        lease: Duration::from_millis(300),
        ttl: Duration::from_secs(3600),
    };
    let ClaimOutcome::Acquired { claim, .. } = three.claim(&req).await.unwrap() else {
        panic!("a fresh key")
    };
    assert!(
        b.load("PAY", &key).await.unwrap().is_some()
            && c.load("PAY", &key).await.unwrap().is_some(),
        "claimed on both shards"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let Ok(ClaimOutcome::Acquired { how, .. }) = c.claim(&req).await else {
        panic!("the new shard's claim is taken over")
    };
    assert_eq!(how, Acquired::TakeOver);
    let renewed = three
        .renew("PAY", &key, &claim, Duration::from_secs(5))
        .await;
    assert!(
        matches!(renewed, Err(IdemError::LeaseLost { .. })),
        "{renewed:?}"
    );
}

/// A holder from before the move whose lease ends while the tool stands for it on the new shard:
/// the tool takes the old shard's claim over before it gives the new one back, so the holder,
/// waking, can neither renew nor mark there, and the key runs once more, by a takeover, not
/// beside it.
#[tokio::test]
async fn a_holder_past_its_lease_is_fenced_out_of_its_old_shard_by_the_move() {
    use crate::store::{ClaimOutcome, ClaimRequest};
    use std::time::Duration;
    let (a, b, c) = shards().await;
    let two = ShardedStore::new([a.clone(), b.clone()]).unwrap();
    let three = ShardedStore::new([a.clone(), b.clone(), c.clone()]).unwrap();
    let key = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| super::route::shard("PAY", k, 3) == 2)
        .unwrap();
    let req = ClaimRequest {
        biz: "PAY",
        key: &key,
        fingerprint: None,
        lease: Duration::from_secs(1),
        ttl: Duration::from_secs(3600),
    };
    let ClaimOutcome::Acquired { claim, .. } = two.claim(&req).await.unwrap() else {
        panic!("a fresh key")
    };
    // The holder stalls: its lease ends before the copy reaches it.
    let done = Reshard::new(&two, &three).run(|_| {}).await.unwrap();
    assert_eq!(done.phase, Some(Phase::Done));
    let old = [&a, &b][super::route::shard("PAY", &key, 2)];
    let renewed = old.renew("PAY", &key, &claim, Duration::from_secs(5)).await;
    assert!(
        matches!(renewed, Err(IdemError::LeaseLost { .. })),
        "{renewed:?}"
    );
    let marked = two
        .complete(
            "PAY",
            &key,
            &claim,
            br#"{"Ok":"late"}"#,
            Duration::from_secs(3600),
        )
        .await;
    assert!(
        matches!(marked, Err(IdemError::LeaseLost { .. })),
        "{marked:?}"
    );
    let ran = Arc::new(AtomicU32::new(0));
    let counted = ran.clone();
    let answer: Result<String, IdemError> = Call::new("PAY", &key)
        .run(&three, async move {
            counted.fetch_add(1, Ordering::Relaxed);
            Ok("paid".to_owned())
        })
        .await;
    assert_eq!(answer.unwrap(), "paid");
    assert_eq!(ran.load(Ordering::Relaxed), 1, "the takeover runs the body");
}
