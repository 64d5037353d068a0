//! `Call`'s own tests: the default heartbeat, and the checked mark `#[idempotent]` sets.

use super::*;

#[test]
fn the_default_heartbeat_is_a_third_of_the_lease() {
    assert_eq!(DEFAULT_LEASE_THIRD, DEFAULT_LEASE / 3);
    for lease in [
        DEFAULT_LEASE,
        Duration::from_secs(31),
        Duration::from_millis(3),
    ] {
        assert_eq!(
            Heartbeat::Default.every(lease),
            Some(lease / 3),
            "{lease:?}"
        );
    }
    assert_eq!(Heartbeat::Default.every(Duration::from_millis(2)), None);
}

/// A call marked checked (as `#[idempotent]` marks the call it built from literals it checked)
/// skips the duration checks; a builder method after the mark checks them again.
#[test]
fn a_duration_set_after_the_checked_mark_is_checked() {
    let store = crate::MemoryStore::new();
    let invalid =
        |call: Call| matches!(call.request(&store), Err(IdemError::InvalidOptions { .. }));
    let zero = Duration::ZERO;
    assert!(invalid(Call::new("PAY", "k").lease(zero)));
    assert!(invalid(Call::new("PAY", "k").checked().lease(zero)));
    assert!(invalid(Call::new("PAY", "k").checked().heartbeat(zero)));
    assert!(invalid(Call::new("PAY", "k").checked().result_ttl(zero)));
    assert!(invalid(Call::new("PAY", "k").checked().store_timeout(zero)));
    assert!(invalid(Call::new("PAY", "k").checked().ttl(DEFAULT_LEASE)));
    assert!(!invalid(Call::new("PAY", "k").checked()));
    // Still checked after the mark: the business type and the key.
    assert!(matches!(
        Call::new("PAY", "").checked().request(&store),
        Err(IdemError::InvalidKey { .. })
    ));
}

/// An integer key's text is not checked (it is always digits and a sign), but its length still is:
/// a store whose keys are shorter than the integer's text refuses it, as it refuses any longer key.
#[test]
fn an_integer_key_is_checked_for_its_length_only() {
    let store = crate::MemoryStore::new()
        .with_limits(crate::store::Limits {
            max_key_len: 5,
            ..crate::store::Limits::default()
        })
        .unwrap();
    let refused = |call: Call| matches!(call.request(&store), Err(IdemError::InvalidKey { .. }));
    assert!(!refused(Call::new("PAY", &12_345u64)));
    assert!(!refused(Call::new("PAY", &-1234i32)));
    assert!(refused(Call::new("PAY", &123_456u64)));
    assert!(refused(Call::new("PAY", &-12_345i64)));
    assert!(refused(Call::new("PAY", &&Box::new(123_456u32))));
    assert!(Call::new("PAY", &7u8).plain_key);
    assert!(Call::new("PAY", &std::sync::Arc::new(7u8)).plain_key);
    // Text is checked whatever it holds.
    assert!(!Call::new("PAY", "7").plain_key);
    assert!(refused(Call::new("PAY", " ")));
}

/// A replay on the memory store decodes a short result where the store keeps it and a long one
/// from a copy: both give the first call's value back, and a stored result that does not decode
/// into the call's type is the same refusal either way.
#[tokio::test]
async fn a_replay_gives_the_same_answer_lent_or_copied() {
    let store = crate::MemoryStore::new();
    let max = crate::MemoryStore::LENT_REPLAY_MAX;
    // JSON text of these lengths: the quotes and the envelope around them make "short" stay
    // under the limit and "long" go over it.
    for (key, len) in [("short", 16), ("long", max + 1)] {
        let value = "x".repeat(len);
        let ran = std::sync::atomic::AtomicUsize::new(0);
        for _ in 0..2 {
            let got: Result<String, IdemError> = Call::new("PAY", key)
                .run(&store, async {
                    ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok(value.clone())
                })
                .await;
            assert_eq!(got.unwrap(), value, "{key}");
        }
        assert_eq!(ran.into_inner(), 1, "{key}: the body ran once");
        let stored = store
            .load("PAY", key)
            .await
            .unwrap()
            .unwrap()
            .snapshot
            .unwrap();
        assert_eq!(
            stored.len() > max,
            key == "long",
            "{key}: {} bytes",
            stored.len()
        );
        // The same record asked for another type: a decode error, lent or copied.
        let wrong: Result<u64, IdemError> =
            Call::new("PAY", key).run(&store, async { Ok(0) }).await;
        assert!(
            matches!(wrong, Err(IdemError::ReplayDecode { .. })),
            "{key}: {wrong:?}"
        );
    }
}
