//! The replay cache's unit tests.

use super::*;
use crate::{Call, MemoryStore};

#[test]
fn sizes_and_ages_out_of_range_are_refused() {
    assert!(ReplayCache::new(MIN_CACHE_BYTES - 1).is_err());
    assert!(ReplayCache::new(MAX_CACHE_BYTES + 1).is_err());
    let c = ReplayCache::new(MIN_CACHE_BYTES).unwrap();
    assert!(c.clone().with_max_age(Duration::ZERO).is_err());
    assert!(
        c.clone()
            .with_max_age(crate::MAX_DURATION + Duration::from_secs(1))
            .is_err()
    );
    assert_eq!(
        c.with_max_age(Duration::from_secs(5)).unwrap().max_age(),
        Duration::from_secs(5)
    );
}

#[test]
fn pairs_have_distinct_slots() {
    assert_ne!(slot("AB", "C"), slot("A", "BC"));
    assert_ne!(slot("1:A", "B"), slot("1", ":AB"));
}

async fn run(
    store: &CachedStore<MemoryStore>,
    key: &str,
    fp: u32,
    value: u32,
) -> Result<u32, IdemError> {
    Call::new("PAY", key)
        .fingerprint(&fp)
        .ttl(Duration::from_millis(400))
        .lease(Duration::from_millis(100))
        .run(store, async move { Ok(value) })
        .await
}

/// Both clocks moved together, as real time moves them.
async fn advance(clock: &crate::TestClock, by: Duration) {
    clock.advance(by);
    tokio::time::advance(by).await;
}

#[tokio::test(start_paused = true)]
async fn it_answers_successes_until_their_ttl_and_nothing_else() {
    let clock = crate::TestClock::new();
    let memory = MemoryStore::new().with_test_clock(clock.clone());
    let store = CachedStore::new(memory, ReplayCache::new(1 << 20).unwrap());
    assert_eq!(run(&store, "a", 1, 1).await.unwrap(), 1);
    assert_eq!((store.len(), store.hits()), (1, 0));
    assert_eq!(run(&store, "a", 1, 2).await.unwrap(), 1, "a replay");
    assert!(matches!(
        run(&store, "a", 2, 3).await,
        Err(IdemError::PayloadMismatch)
    ));
    assert_eq!(store.hits(), 2, "both answered from memory");
    // A failure is not cached: the retry runs (through the store).
    let failed: Result<u32, IdemError> = Call::new("PAY", "b")
        .run(&store, async { Err(IdemError::store("declined")) })
        .await;
    assert!(failed.is_err());
    assert_eq!(run(&store, "b", 1, 4).await.unwrap(), 4);
    assert_eq!(store.hits(), 2);
    // Past the ttl the cache answers nothing, and the store runs the body again.
    advance(&clock, Duration::from_millis(401)).await;
    assert_eq!(run(&store, "a", 1, 5).await.unwrap(), 5);
    assert_eq!(store.hits(), 2);
}

/// A result kept shorter than its record is answered from memory only while it is kept;
/// after that the store refuses the repeat as expired, and the cache never replays it.
#[tokio::test(start_paused = true)]
async fn a_result_kept_shorter_than_its_key_leaves_the_cache_with_it() {
    let clock = crate::TestClock::new();
    let memory = MemoryStore::new().with_test_clock(clock.clone());
    let store = CachedStore::new(memory, ReplayCache::new(1 << 20).unwrap());
    let kept = |value: u32| {
        Call::new("PAY", "k")
            .ttl(Duration::from_millis(400))
            .lease(Duration::from_millis(100))
            .result_ttl(Duration::from_millis(150))
            .run(&store, async move { Ok::<_, IdemError>(value) })
    };
    assert_eq!(kept(1).await.unwrap(), 1);
    assert_eq!(kept(2).await.unwrap(), 1, "a replay from memory");
    assert_eq!(store.hits(), 1);
    advance(&clock, Duration::from_millis(151)).await;
    assert!(matches!(kept(3).await, Err(IdemError::ResultExpired)));
    assert_eq!(
        store.hits(),
        1,
        "the cache did not answer past the result ttl"
    );
}

#[tokio::test(start_paused = true)]
async fn max_age_cuts_an_entry_short() {
    let cache = ReplayCache::new(1 << 20)
        .unwrap()
        .with_max_age(Duration::from_millis(50))
        .unwrap();
    let clock = crate::TestClock::new();
    let store = CachedStore::new(MemoryStore::new().with_test_clock(clock.clone()), cache);
    assert_eq!(run(&store, "a", 1, 1).await.unwrap(), 1);
    advance(&clock, Duration::from_millis(60)).await;
    assert_eq!(
        run(&store, "a", 1, 2).await.unwrap(),
        1,
        "the store replays"
    );
    assert_eq!(store.hits(), 0, "past its max age the cache did not answer");
}

#[tokio::test]
async fn it_holds_no_more_than_its_bytes() {
    let store = CachedStore::new(
        MemoryStore::new(),
        ReplayCache::new(MIN_CACHE_BYTES).unwrap(),
    );
    for i in 0..200 {
        run(&store, &format!("k-{i}"), 1, i).await.unwrap();
    }
    let per_entry = ENTRY_OVERHEAD + 8;
    assert!(
        store.len() <= MIN_CACHE_BYTES / per_entry + 1,
        "{} entries in {MIN_CACHE_BYTES} bytes",
        store.len()
    );
    assert!(!store.is_empty());
}
