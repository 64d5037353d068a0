//! The memory store's queues and processing list: what a pass reads, and that every change keeps
//! them.

use std::time::Duration;

use super::MemoryStore;
use crate::TestClock;
use crate::store::{Claim, ClaimOutcome, ClaimRequest, Store};

fn req<'a>(biz: &'a str, key: &'a str, ttl: Duration) -> ClaimRequest<'a> {
    ClaimRequest {
        biz,
        key,
        fingerprint: None,
        lease: Duration::from_secs(10),
        ttl,
    }
}

async fn done(store: &MemoryStore, biz: &str, key: &str, ttl: Duration) {
    let ClaimOutcome::Acquired { claim, .. } = store.claim(&req(biz, key, ttl)).await.unwrap()
    else {
        panic!("{key}: not acquired");
    };
    store.complete(biz, key, &claim, b"ok", ttl).await.unwrap();
}

/// Every PROCESSING record is in its business type's `processing` list at its own slot, and
/// nothing else is.
fn check_slots(store: &MemoryStore) {
    for by_biz in store.lock().values() {
        for (i, key) in by_biz.processing.iter().enumerate() {
            let e = &by_biz.records[&**key];
            assert_eq!(e.status, super::Status::Processing, "{key}");
            assert_eq!(e.slot as usize, i, "{key}");
        }
        let processing = by_biz
            .records
            .values()
            .filter(|e| e.status == super::Status::Processing)
            .count();
        assert_eq!(processing, by_biz.processing.len());
    }
}

/// Claims, marks, failures, takeovers and sweeps interleaved over many keys keep the slots.
#[tokio::test]
async fn slots_follow_every_change() {
    let clock = TestClock::new();
    let store = MemoryStore::new().with_test_clock(clock.clone());
    let ttl = Duration::from_secs(60);
    let mut held = Vec::new();
    for round in 0..20u32 {
        for k in 0..50u32 {
            let key = format!("k-{}", (k * 7 + round) % 60);
            if let ClaimOutcome::Acquired { claim, .. } =
                store.claim(&req("B", &key, ttl)).await.unwrap()
            {
                held.push((key, claim));
            }
        }
        // Finish some in an order other than they came: the last slot moves each time.
        let mut i = 0;
        held.retain(|_| {
            i += 1;
            i % 3 == 0
        });
        for (n, (key, claim)) in held.drain(..).enumerate() {
            if n % 2 == 0 {
                let _ = store.complete("B", &key, &claim, b"ok", ttl).await;
            } else {
                let _ = store.fail("B", &key, &claim).await;
            }
        }
        check_slots(&store);
        clock.advance(Duration::from_secs(11 + u64::from(round % 3) * 30));
        store.sweep_expired(7).await.unwrap();
        check_slots(&store);
    }
}

/// A sweep takes the records whose time came and leaves the others where they are queued:
/// one expiry item per record, none popped early.
#[tokio::test]
async fn a_sweep_takes_only_what_is_due() {
    let clock = TestClock::new();
    let store = MemoryStore::new().with_test_clock(clock.clone());
    for i in 0..1000 {
        done(&store, "B", &format!("live-{i}"), Duration::from_secs(3600)).await;
    }
    for i in 0..10 {
        done(&store, "B", &format!("due-{i}"), Duration::from_secs(30)).await;
    }
    assert_eq!(store.lock()["B"].expiries.len(), 1010);
    clock.advance(Duration::from_secs(31));
    assert_eq!(store.sweep_expired(4).await.unwrap(), 4);
    assert_eq!(store.sweep_expired(100).await.unwrap(), 6);
    let records = store.lock();
    assert_eq!(records["B"].expiries.len(), 1000);
    assert_eq!(records["B"].records.len(), 1000);
    assert!(!records["B"].records.contains_key("due-0"));
    assert!(records["B"].records.contains_key("live-0"));
}

/// The `processing` set holds the PROCESSING records and nothing else: a failure and a mark
/// take a record out, a takeover keeps it in once.
#[tokio::test]
async fn the_processing_set_holds_only_processing_records() {
    let clock = TestClock::new();
    let store = MemoryStore::new().with_test_clock(clock.clone());
    let ttl = Duration::from_secs(3600);
    for _ in 0..100 {
        let ClaimOutcome::Acquired { claim, .. } = store.claim(&req("B", "k", ttl)).await.unwrap()
        else {
            panic!("not acquired");
        };
        assert_eq!(store.lock()["B"].processing.len(), 1);
        store.fail("B", "k", &claim).await.unwrap();
        assert_eq!(store.lock()["B"].processing.len(), 0);
    }
    // A takeover moves the record's entry; a mark takes it out.
    store.claim(&req("B", "k", ttl)).await.unwrap();
    clock.advance(Duration::from_secs(11));
    let ClaimOutcome::Acquired { claim, .. } = store.claim(&req("B", "k", ttl)).await.unwrap()
    else {
        panic!("not taken over");
    };
    assert_eq!(store.lock()["B"].processing.len(), 1);
    store.complete("B", "k", &claim, b"ok", ttl).await.unwrap();
    assert_eq!(store.lock()["B"].processing.len(), 0);
}

/// The stuck list reads the `processing` set: a renewal moves a record later, a mark takes it
/// out, and the stuck ones stay for the next pass.
#[tokio::test]
async fn stuck_records_come_from_the_processing_set() {
    let clock = TestClock::new();
    let store = MemoryStore::new().with_test_clock(clock.clone());
    let ttl = Duration::from_secs(3600);
    let mut claims = Vec::new();
    for key in ["a", "b", "c"] {
        let ClaimOutcome::Acquired { claim, .. } = store.claim(&req("B", key, ttl)).await.unwrap()
        else {
            panic!("{key}: not acquired");
        };
        claims.push(claim);
        clock.advance(Duration::from_millis(5));
    }
    store
        .complete("B", "b", &claims[1], b"ok", ttl)
        .await
        .unwrap();
    clock.advance(Duration::from_secs(11));
    store
        .renew("B", "a", &claims[0], Duration::from_secs(10))
        .await
        .unwrap();
    let keys = |v: Vec<crate::store::Record>| v.into_iter().map(|r| r.key).collect::<Vec<_>>();
    assert_eq!(keys(store.stuck("B", 10).await.unwrap()), ["c"]);
    assert_eq!(
        keys(store.stuck("B", 10).await.unwrap()),
        ["c"],
        "still stuck"
    );
    clock.advance(Duration::from_secs(11));
    assert_eq!(keys(store.stuck("B", 10).await.unwrap()), ["c", "a"]);
    assert_eq!(keys(store.stuck("B", 1).await.unwrap()), ["c"]);
    store.sweep_expired(10).await.unwrap();
    assert_eq!(
        store.lock()["B"].processing.len(),
        2,
        "the sweep keeps the stuck"
    );
}

/// What the engine asks at once (`__claim_now`, `__complete_now`) is what a store-level caller gets
/// from `claim` and `complete`: each step of a key's life, asked both ways on two stores, answers
/// the same and leaves the same record.
#[tokio::test]
async fn answering_at_once_is_answering_through_the_future() {
    let ttl = Duration::from_secs(60);
    let (now, later) = (MemoryStore::new(), MemoryStore::new());
    let r = req("PAY", "k", ttl);
    let (a, b) = (
        now.__claim_now(&r).unwrap().unwrap(),
        later.claim(&r).await.unwrap(),
    );
    let (
        ClaimOutcome::Acquired { claim: ca, how: ha },
        ClaimOutcome::Acquired { claim: cb, how: hb },
    ) = (a, b)
    else {
        panic!("a new key is not acquired both ways");
    };
    assert_eq!((ca.attempt, ha), (cb.attempt, hb));
    let (a, b) = (
        now.__claim_now(&r).unwrap().unwrap(),
        later.claim(&r).await.unwrap(),
    );
    assert!(matches!(a, ClaimOutcome::InProgress { .. }), "{a:?}");
    assert!(matches!(b, ClaimOutcome::InProgress { .. }), "{b:?}");
    let mut bytes = b"ok".to_vec();
    now.__complete_now("PAY", "k", &ca, &mut bytes, ttl, None)
        .unwrap()
        .unwrap();
    assert!(bytes.is_empty(), "the store keeps the bytes it was given");
    later.complete("PAY", "k", &cb, b"ok", ttl).await.unwrap();
    for store in [&now, &later] {
        let record = store.load("PAY", "k").await.unwrap().expect("kept");
        assert_eq!(record.status, super::Status::Succeeded);
        assert_eq!(record.snapshot.as_deref(), Some(&b"ok"[..]));
    }
    let (a, b) = (
        now.__claim_now(&r).unwrap().unwrap(),
        later.claim(&r).await.unwrap(),
    );
    let (ClaimOutcome::Replay { snapshot: sa }, ClaimOutcome::Replay { snapshot: sb }) = (a, b)
    else {
        panic!("a finished key does not replay both ways");
    };
    assert_eq!((sa.as_slice(), sb.as_slice()), (&b"ok"[..], &b"ok"[..]));
    // A mark under a fence that is not the record's is refused both ways.
    let stale = crate::store::Claim {
        attempt: ca.attempt,
        fence: crate::store::Fence::new(ca.fence.get() + 1),
    };
    assert!(matches!(
        now.__complete_now("PAY", "k", &stale, &mut b"no".to_vec(), ttl, Some(ttl / 2))
            .unwrap(),
        Err(crate::IdemError::LeaseLost { .. })
    ));
    assert!(matches!(
        later
            .complete_keeping("PAY", "k", &stale, b"no", ttl, ttl / 2)
            .await,
        Err(crate::IdemError::LeaseLost { .. })
    ));
    // A buffer with much to spare is copied at its length, not kept with its spare capacity.
    let roomy_req = req("PAY", "roomy", ttl);
    let Some(Ok(ClaimOutcome::Acquired { claim, .. })) = now.__claim_now(&roomy_req) else {
        panic!("a new key is not acquired");
    };
    let mut roomy = Vec::with_capacity(64);
    roomy.extend_from_slice(b"ok");
    now.__complete_now("PAY", "roomy", &claim, &mut roomy, ttl, None)
        .unwrap()
        .unwrap();
    assert_eq!(roomy, b"ok", "copied, not taken");
    {
        let records = now.lock();
        let kept = records["PAY"].records["roomy"].snapshot.as_ref().unwrap();
        assert_eq!((kept.as_slice(), kept.capacity()), (&b"ok"[..], 2));
    }
    let mut refused = b"no".to_vec();
    let _ = now.__complete_now("PAY", "k", &stale, &mut refused, ttl, None);
    assert_eq!(refused, b"no", "a mark that did not land leaves its bytes");
}

/// A replay asked with a lender (`__claim_now_lending`) lends a result of up to
/// `LENT_REPLAY_MAX` bytes, once, and copies a longer one into the outcome; no other outcome
/// lends anything.
#[tokio::test]
async fn a_short_result_is_lent_and_a_long_one_copied() {
    let ttl = Duration::from_secs(60);
    let store = MemoryStore::new();
    let cases = [
        ("short", vec![b'a'; MemoryStore::LENT_REPLAY_MAX]),
        ("long", vec![b'b'; MemoryStore::LENT_REPLAY_MAX + 1]),
    ];
    for (key, result) in &cases {
        let r = req("PAY", key, ttl);
        let mut seen = Vec::new();
        let outcome = store
            .__claim_now_lending(&r, &mut |b| seen.push(b.to_vec()))
            .unwrap()
            .unwrap();
        let ClaimOutcome::Acquired { claim, .. } = outcome else {
            panic!("{key}: not acquired: {outcome:?}");
        };
        assert!(seen.is_empty(), "{key}: a claim lends nothing");
        let outcome = store
            .__claim_now_lending(&r, &mut |b| seen.push(b.to_vec()))
            .unwrap()
            .unwrap();
        assert!(
            matches!(outcome, ClaimOutcome::InProgress { .. }),
            "{outcome:?}"
        );
        assert!(seen.is_empty(), "{key}: a refusal lends nothing");
        store
            .complete("PAY", key, &claim, result, ttl)
            .await
            .unwrap();
        let outcome = store
            .__claim_now_lending(&r, &mut |b| seen.push(b.to_vec()))
            .unwrap()
            .unwrap();
        let ClaimOutcome::Replay { snapshot } = outcome else {
            panic!("{key}: no replay: {outcome:?}");
        };
        if result.len() <= MemoryStore::LENT_REPLAY_MAX {
            assert_eq!(seen, vec![result.clone()], "{key}: lent once");
            assert!(snapshot.is_empty(), "{key}: and not copied");
        } else {
            assert!(seen.is_empty(), "{key}: not lent");
            assert_eq!(&snapshot, result, "{key}: copied");
        }
    }
}

/// A lease that held a record past its TTL, then ended sooner than the queue had it (released,
/// failed, or shortened by a renewal): the next sweep deletes the record, and the queue keeps one
/// item per record.
#[tokio::test]
async fn a_lease_ended_early_is_swept_when_it_ends() {
    /// A record claimed with a 40 s lease and a 15 s TTL, 16 s later: past its TTL, held by its
    /// lease, so not swept, and queued again at the lease's end.
    async fn held_past_its_ttl() -> (TestClock, MemoryStore, Claim) {
        let clock = TestClock::new();
        let store = MemoryStore::new().with_test_clock(clock.clone());
        let r = ClaimRequest {
            lease: Duration::from_secs(40),
            ..req("B", "k", Duration::from_secs(15))
        };
        let ClaimOutcome::Acquired { claim, .. } = store.claim(&r).await.unwrap() else {
            panic!("not acquired");
        };
        clock.advance(Duration::from_secs(16));
        assert_eq!(store.sweep_expired(100).await.unwrap(), 0);
        (clock, store, claim)
    }
    for end in ["release", "fail", "renew"] {
        let (clock, store, claim) = held_past_its_ttl().await;
        match end {
            "release" => store.release("B", "k", &claim).await.unwrap(),
            "fail" => store.fail("B", "k", &claim).await.unwrap(),
            _ => store
                .renew("B", "k", &claim, Duration::from_secs(1))
                .await
                .unwrap(),
        }
        if end == "renew" {
            assert_eq!(store.sweep_expired(100).await.unwrap(), 0, "{end}");
            clock.advance(Duration::from_secs(1));
        }
        assert_eq!(store.sweep_expired(100).await.unwrap(), 1, "{end}");
        assert!(store.load("B", "k").await.unwrap().is_none(), "{end}");
        // Its business type went with it, queue and all.
        assert!(store.lock().get("B").is_none(), "{end}");
    }
    // Queued twice at the same time, a record is looked at once and queued again once.
    let (clock, store, claim) = held_past_its_ttl().await;
    store
        .renew("B", "k", &claim, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(store.lock()["B"].expiries.len(), 2);
    clock.advance(Duration::from_secs(1));
    store
        .renew("B", "k", &claim, Duration::from_secs(30))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(1));
    assert_eq!(store.sweep_expired(100).await.unwrap(), 0);
    assert_eq!(
        store.lock()["B"].expiries.len(),
        2,
        "the old item and the one queued again"
    );
    clock.advance(Duration::from_secs(40));
    assert_eq!(store.sweep_expired(100).await.unwrap(), 1);
}
