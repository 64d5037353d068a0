//! Contract cases at the edges of the input space, run on every store: record identity (distinct
//! `(biz, key)` pairs are distinct records, whatever separators, braces or escapes they hold) and
//! durations at their limits (0, 1 ns, 1 ms, the maximum, one nanosecond more, `Duration::MAX`).
//!
//! The identity case is a proptest property: it generates strings over an alphabet of separators
//! and splits each one at two places, so that a store whose record key is a plain concatenation
//! of biz and key (`{biz:key}`) maps two pairs to one record; a failure shrinks to the smallest
//! colliding pair. The async store calls run on the test's runtime from inside proptest's
//! synchronous runner (`block_in_place`; every contract test runs on a multi-thread runtime).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use idem::{
    Call, IdemError, MAX_DURATION, Store,
    store::{ClaimOutcome, ClaimRequest, Status},
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::Subject;

/// A short tag unique to this run and call (8 characters), so records of earlier runs on a shared
/// server never answer, while the generated part of a business type keeps 24 of its 32 bytes.
fn run_tag() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{:06x}{:02x}", (micros as u64) & 0xff_ffff, n & 0xff)
}

/// What a separator-blind encoding would confuse: separators, braces (Redis hash tags), escapes,
/// SQL wildcards and quotes, digits (length prefixes), case, spaces and multi-byte characters.
const ATOMS: [&str; 16] = [
    ":", "{", "}", "\\", "%", "_", "*", "'", "0", "3", "a", "A", " ", "支", "é", "🦀",
];

/// Strings over [`ATOMS`], each split at two places into two `(biz, key)` pairs whose
/// concatenations are equal.
fn split_pairs() -> impl Strategy<Value = Vec<(String, String)>> {
    let text = prop::collection::vec(prop::sample::select(ATOMS.to_vec()), 2..10);
    prop::collection::vec(
        (
            text,
            any::<prop::sample::Index>(),
            any::<prop::sample::Index>(),
        ),
        1..4,
    )
    .prop_map(|texts| {
        let mut pairs = Vec::new();
        for (atoms, i, j) in texts {
            for at in [i.index(atoms.len() - 1) + 1, j.index(atoms.len() - 1) + 1] {
                pairs.push((atoms[..at].concat(), atoms[at..].concat()));
            }
        }
        pairs
    })
}

/// Pairs every store must keep apart, written out: the collisions a review found, and their
/// neighbours under a length-prefixed or escaped encoding.
fn written_pairs() -> Vec<(String, String)> {
    [
        ("PAY", "x:y"),
        ("PAY:x", "y"),
        ("PAY:x:", "y"),
        ("P", "AY:x:y"),
        ("PAY", "{x}"),
        ("PAY{", "x}"),
        ("PAY}", "{x"),
        ("3", "PAY:x"),
        ("3:PAY", "x"),
        ("PAY", "3:x"),
        ("PAY\\", ":x"),
        ("PAY", "\\:x"),
        // `key = "(\"REFUND\", id)"` under `biz = "ORDER"` against `key = "id"` under
        // `biz = "ORDER:REFUND"`: a tuple key joins its parts with `:`.
        ("ORDER", "REFUND:7"),
        ("ORDER:REFUND", "7"),
    ]
    .into_iter()
    .map(|(b, k)| (b.to_owned(), k.to_owned()))
    .collect()
}

/// Runs each distinct valid pair once (the body returns its index), then again: every repeat
/// must replay its own pair's answer with no body run, and load its own record.
async fn distinct_records(
    store: &dyn Store,
    pairs: Vec<(String, String)>,
) -> Result<(), TestCaseError> {
    let tag = run_tag();
    let pairs: BTreeSet<(String, String)> = pairs
        .into_iter()
        .filter(|(biz, key)| {
            !biz.is_empty()
                && !biz.chars().any(char::is_whitespace)
                && !key.trim().is_empty()
                && biz.len() + tag.len() <= 32
        })
        .map(|(biz, key)| (format!("{tag}{biz}"), key))
        .collect();
    let runs = AtomicUsize::new(0);
    for round in 0..2 {
        for (i, (biz, key)) in pairs.iter().enumerate() {
            let before = runs.load(Ordering::SeqCst);
            let got: Result<usize, IdemError> = Call::new(biz.clone(), key.as_str())
                .run(store, async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok(i)
                })
                .await;
            let ran = runs.load(Ordering::SeqCst) - before;
            prop_assert_eq!(
                got.as_ref().ok(),
                Some(&i),
                "({:?}, {:?}) in round {} answered {:?}: another pair's record",
                biz,
                key,
                round,
                got
            );
            prop_assert_eq!(
                ran,
                usize::from(round == 0),
                "({:?}, {:?}) in round {}: the body ran {} times",
                biz,
                key,
                round,
                ran
            );
        }
    }
    for (biz, key) in &pairs {
        let record = store
            .load(biz, key)
            .await
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let record =
            record.ok_or_else(|| TestCaseError::fail(format!("({biz:?}, {key:?}) lost")))?;
        prop_assert_eq!((&record.biz, &record.key), (biz, key));
        prop_assert_eq!(record.status, Status::Succeeded);
    }
    Ok(())
}

/// Distinct `(biz, key)` pairs are distinct records (a composite key), on every store.
pub async fn distinct_pairs_are_distinct_records(s: Subject) {
    let store = s.store;
    distinct_records(&*store, written_pairs()).await.unwrap();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(24);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let handle = tokio::runtime::Handle::current();
    let outcome = tokio::task::block_in_place(|| {
        runner.run(&split_pairs(), |pairs| {
            handle.block_on(distinct_records(&*store, pairs))
        })
    });
    if let Err(e) = outcome {
        panic!("two (biz, key) pairs shared a record: {e}");
    }
}

/// The edges every duration option is tried at.
fn edges() -> [Duration; 8] {
    [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_millis(1),
        Duration::from_secs(30),
        Duration::from_secs(3600),
        MAX_DURATION,
        MAX_DURATION + Duration::from_nanos(1),
        Duration::MAX,
    ]
}

/// The documented rule (`idem::MAX_DURATION`): a lease of 1 ms to the maximum, a ttl longer than
/// the lease and at most the maximum.
fn valid(ttl: Duration, lease: Duration) -> bool {
    lease >= Duration::from_millis(1) && lease <= MAX_DURATION && ttl > lease && ttl <= MAX_DURATION
}

const DAY_MS: i64 = 86_400_000;

/// A `Call` option taking a duration: its name, its setter and its documented range.
type DurationOption = (
    &'static str,
    fn(Call, Duration) -> Call,
    fn(Duration) -> bool,
);

/// Every (ttl, lease) pair of edges on a call: refused with `InvalidOptions` before anything is
/// written when out of range; run once and replayed when in range, on a record that lives as long
/// as asked (the maximum included: no wrap, no overflow, no early delete by the store or the
/// sweeper). Then the same for a wait and a heartbeat.
pub async fn durations_at_the_limits(s: Subject) {
    let store = s.store;
    let biz = super::biz("dur");
    let runs = AtomicUsize::new(0);
    let body = |n: u32| {
        let runs = &runs;
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<u32, IdemError>(n)
        }
    };
    let mut n = 0u32;
    for ttl in edges() {
        for lease in edges() {
            n += 1;
            let key = format!("tl-{n}");
            let call = || Call::new(biz.clone(), key.as_str()).ttl(ttl).lease(lease);
            let before = runs.load(Ordering::SeqCst);
            let got = call().run(&*store, body(n)).await;
            let what = format!("ttl {ttl:?}, lease {lease:?}");
            if !valid(ttl, lease) {
                assert!(
                    matches!(got, Err(IdemError::InvalidOptions { .. })),
                    "{what}: {got:?}"
                );
                assert_eq!(runs.load(Ordering::SeqCst), before, "{what}: the body ran");
                assert!(
                    store.load(&biz, &key).await.unwrap().is_none(),
                    "{what}: written"
                );
                continue;
            }
            assert_eq!(got.unwrap(), n, "{what}");
            assert_eq!(
                call().run(&*store, body(0)).await.unwrap(),
                n,
                "{what}: replay"
            );
            assert_eq!(runs.load(Ordering::SeqCst), before + 1, "{what}: ran twice");
            let record = store.load(&biz, &key).await.unwrap().expect("a record");
            assert_eq!(record.status, Status::Succeeded, "{what}");
            // The claim set lease_until = now + lease and expire_at = now + ttl (store clock).
            let life = record.expire_at_ms - (record.lease_until_ms - lease.as_millis() as i64);
            assert!(
                (life - ttl.as_millis() as i64).abs() < DAY_MS,
                "{what}: the record lives {life} ms"
            );
        }
    }
    // Nothing in range expires early: a sweep now deletes none of them.
    store.sweep_expired(1000).await.unwrap();
    let kept = (1..=n)
        .filter(|i| {
            let (ttl, lease) = (
                edges()[(*i as usize - 1) / 8],
                edges()[(*i as usize - 1) % 8],
            );
            valid(ttl, lease) && ttl > Duration::from_secs(60)
        })
        .collect::<Vec<_>>();
    for i in kept {
        let record = store.load(&biz, &format!("tl-{i}")).await.unwrap();
        assert!(record.is_some(), "record tl-{i} was swept before its ttl");
    }
    // A wait of 0 ..= the maximum; a heartbeat of at least 1 ms and shorter than the lease (30 s
    // here). Out of range: refused before anything is written.
    let options: [DurationOption; 2] = [
        ("wait", Call::wait, |d| d <= MAX_DURATION),
        ("heartbeat", Call::heartbeat, |d| {
            d >= Duration::from_millis(1) && d < Duration::from_secs(30)
        }),
    ];
    for (name, set, in_range) in options {
        for d in edges() {
            n += 1;
            let key = format!("{name}-{n}");
            let got = set(Call::new(biz.clone(), key.as_str()), d)
                .run(&*store, body(n))
                .await;
            if in_range(d) {
                assert_eq!(got.unwrap(), n, "{name} {d:?}");
            } else {
                assert!(
                    matches!(got, Err(IdemError::InvalidOptions { .. })),
                    "{name} {d:?}: {got:?}"
                );
                assert!(
                    store.load(&biz, &key).await.unwrap().is_none(),
                    "{name} {d:?}: written"
                );
            }
        }
    }
}

/// A store called directly (the `Store` trait is public) with durations past the maximum clamps
/// them to it: the claim holds, its record lives about ten years, it is marked and replayed, and
/// neither the store nor its sweeper deletes it (on Redis a wrapped `PEXPIREAT` deleted it at
/// once; on SQLite the expiry overflowed into a REAL that no later read could decode).
pub async fn a_store_clamps_durations_it_is_handed(s: Subject) {
    let store = s.store;
    let biz = super::biz("clamp");
    let key = "k";
    let req = ClaimRequest {
        biz: &biz,
        key,
        fingerprint: None,
        lease: Duration::MAX,
        ttl: Duration::MAX,
    };
    let ClaimOutcome::Acquired { claim, .. } = store.claim(&req).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    let record = store
        .load(&biz, key)
        .await
        .unwrap()
        .expect("the claim is kept");
    let years = |ms: i64| ms as f64 / (365.25 * DAY_MS as f64);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let max_ms = MAX_DURATION.as_millis() as i64;
    for (what, at) in [
        ("lease", record.lease_until_ms),
        ("expiry", record.expire_at_ms),
    ] {
        // The store's clock may run ahead of this one by a test clock's offset (none here) or a
        // little skew: a day either way.
        assert!(
            (at - now_ms - max_ms).abs() < DAY_MS,
            "the {what} ends in {:.2} years, not at the maximum",
            years(at - now_ms)
        );
    }
    store
        .complete(&biz, key, &claim, b"\"done\"", req.ttl)
        .await
        .unwrap();
    store.sweep_expired(1000).await.unwrap();
    match store.claim(&req).await.unwrap() {
        ClaimOutcome::Replay { snapshot } => assert_eq!(snapshot, b"\"done\""),
        other => panic!("the record must replay, got {other:?}"),
    }
    let record = store.load(&biz, key).await.unwrap().expect("still kept");
    assert_eq!(record.status, Status::Succeeded);
    // The mark's expiry (now + the ttl it is handed, clamped too) is still about the maximum.
    assert!(
        (record.expire_at_ms - now_ms - max_ms).abs() < DAY_MS,
        "after the mark the expiry ends in {:.2} years, not at the maximum",
        years(record.expire_at_ms - now_ms)
    );
}
