//! Private snapshots: `EncryptedStore` keeps what calls returned unreadable in the inner store,
//! rotates keys, and refuses (never replays as garbage, never runs again) a snapshot it cannot
//! open: under a dropped key, altered, copied to another record, or never sealed.

use std::sync::atomic::{AtomicU32, Ordering};

use idem::encrypted::ENVELOPE_OVERHEAD;
use idem::metrics::Outcome;
use idem::sqlx;
use idem::{
    Call, EncryptedStore, EncryptedTx, IdemError, Keyring, MemoryStore, SqliteStore, Store,
    error::DecryptFailure,
    idempotent,
    store::{Limits, Status},
};
use serde::{Deserialize, Serialize};

const K1: [u8; 32] = [0x11; 32];
const K2: [u8; 32] = [0x22; 32];
/// Text the business returns: it must never be readable in the inner store.
const SECRET: &str = "card 4111-1111-1111-1111 charged";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order_no: String,
    note: String,
    run: u32,
}

#[derive(Debug, thiserror::Error)]
enum PayError {
    #[error(transparent)]
    Idem(#[from] IdemError),
}

async fn sqlite() -> SqliteStore {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("idem-sealed-{}-{n}.db", std::process::id()));
    let store = SqliteStore::open(&path).await.unwrap();
    store.migrate().await.unwrap();
    store
}

/// Runs the business for `order_no` on `store`, counting real executions in `runs`.
async fn pay(
    store: &dyn Store,
    runs: &AtomicU32,
    order_no: &str,
) -> (Result<Receipt, PayError>, Outcome) {
    let (res, report) = idem::metrics::observe(Call::new("SEAL", order_no).run(store, async {
        Ok(Receipt {
            order_no: order_no.to_owned(),
            note: SECRET.to_owned(),
            run: runs.fetch_add(1, Ordering::SeqCst),
        })
    }))
    .await;
    (res, report.expect("a report").outcome)
}

/// The snapshot exactly as the inner store keeps it.
async fn raw(inner: &SqliteStore, key: &str) -> Vec<u8> {
    inner
        .load("SEAL", key)
        .await
        .unwrap()
        .unwrap()
        .snapshot
        .unwrap()
}

async fn overwrite_raw(inner: &SqliteStore, key: &str, bytes: &[u8]) {
    let done =
        sqlx::query("UPDATE idem_record SET result = ?1 WHERE biz_type = 'SEAL' AND idem_key = ?2")
            .bind(bytes)
            .bind(key)
            .execute(inner.pool())
            .await
            .unwrap();
    assert_eq!(done.rows_affected(), 1);
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

fn decrypt_failure<T: std::fmt::Debug>(res: Result<T, PayError>) -> DecryptFailure {
    match res {
        Err(PayError::Idem(IdemError::SnapshotDecrypt { reason })) => reason,
        other => panic!("expected a decrypt error, got {other:?}"),
    }
}

static MACRO_RUNS: AtomicU32 = AtomicU32::new(0);

#[derive(Serialize, Deserialize)]
struct PayReq {
    order_no: String,
}

#[idempotent(biz = "SEALPAY", key = "req.order_no", store = "sealed")]
async fn pay_by_attribute(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt {
        order_no: req.order_no.clone(),
        note: SECRET.to_owned(),
        run: MACRO_RUNS.fetch_add(1, Ordering::SeqCst),
    })
}

/// Through `#[idempotent]` on a registered `EncryptedStore`: executes once, replays the same
/// answer, and the inner store holds only the envelope.
#[tokio::test]
async fn the_attribute_replays_through_an_encrypted_store() {
    let inner = sqlite().await;
    idem::register_store(
        "sealed",
        EncryptedStore::new(inner.clone(), Keyring::new(1, K1).unwrap()),
    );
    let req = PayReq {
        order_no: "ORD-1".into(),
    };
    let (first, report) = idem::metrics::observe(pay_by_attribute(&req)).await;
    let first = first.unwrap();
    assert_eq!(report.unwrap().outcome, Outcome::Executed);
    let (again, report) = idem::metrics::observe(pay_by_attribute(&req)).await;
    assert_eq!(again.unwrap(), first);
    assert!(report.unwrap().replayed());
    assert_eq!(MACRO_RUNS.load(Ordering::SeqCst), 1, "the body ran once");

    let rec = inner.load("SEALPAY", "ORD-1").await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Succeeded);
    let sealed = rec.snapshot.unwrap();
    assert_eq!(&sealed[..5], b"IDEM\x01", "magic and format version");
    assert_eq!(sealed[5..9], 1u32.to_be_bytes(), "the key id");
    for plain in [SECRET, "4111", "ORD-1", "\"Ok\"", "note"] {
        assert!(
            !contains(&sealed, plain),
            "{plain:?} readable in the inner store"
        );
    }
    // Through the encrypted store, `load` gives the plain snapshot back.
    let opened = idem::store("sealed")
        .unwrap()
        .load("SEALPAY", "ORD-1")
        .await
        .unwrap()
        .unwrap()
        .snapshot
        .unwrap();
    assert!(contains(&opened, SECRET));
    assert_eq!(opened.len() + ENVELOPE_OVERHEAD, sealed.len());
}

/// Key 1 seals a record; after rotating to key 2 (key 1 kept) it still replays and new records use
/// key 2; once key 1 is dropped its record is refused with the unknown-key error and nothing runs.
#[tokio::test]
async fn keys_rotate_and_a_dropped_key_is_a_clear_error() {
    let (inner, runs) = (sqlite().await, AtomicU32::new(0));
    let v1 = EncryptedStore::new(inner.clone(), Keyring::new(1, K1).unwrap());
    let (first, outcome) = pay(&v1, &runs, "old").await;
    let first = first.unwrap();
    assert_eq!(outcome, Outcome::Executed);
    assert_eq!(Keyring::key_id_of(&raw(&inner, "old").await).unwrap(), 1);

    let v2 = EncryptedStore::new(
        inner.clone(),
        Keyring::new(2, K2).unwrap().with_old(1, K1).unwrap(),
    );
    let (again, outcome) = pay(&v2, &runs, "old").await;
    assert_eq!(
        (again.unwrap(), outcome),
        (first.clone(), Outcome::Replayed)
    );
    let (new, outcome) = pay(&v2, &runs, "new").await;
    assert_eq!(outcome, Outcome::Executed);
    let new = new.unwrap();
    let sealed_new = raw(&inner, "new").await;
    assert_eq!(Keyring::key_id_of(&sealed_new).unwrap(), 2);
    assert_eq!(sealed_new[5..9], 2u32.to_be_bytes());
    assert_eq!(
        Keyring::key_id_of(&raw(&inner, "old").await).unwrap(),
        1,
        "not re-sealed"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    let v3 = EncryptedStore::new(inner.clone(), Keyring::new(2, K2).unwrap());
    let (refused, outcome) = pay(&v3, &runs, "old").await;
    assert_eq!(
        decrypt_failure(refused),
        DecryptFailure::UnknownKey { key_id: 1 }
    );
    assert_eq!(outcome, Outcome::Rejected);
    let (still, _) = pay(&v3, &runs, "new").await;
    assert_eq!(still.unwrap(), new, "records under the current key replay");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "nothing ran again");
    let rec = inner.load("SEAL", "old").await.unwrap().unwrap();
    assert_eq!(rec.status, Status::Succeeded, "the record is left as it is");
    match v3.load("SEAL", "old").await {
        Err(IdemError::SnapshotDecrypt {
            reason: DecryptFailure::UnknownKey { key_id: 1 },
        }) => {}
        other => panic!("load under a dropped key: {other:?}"),
    }
    let e = IdemError::SnapshotDecrypt {
        reason: DecryptFailure::UnknownKey { key_id: 1 },
    };
    assert_eq!((e.http_status(), e.is_retryable()), (500, false));
    assert!(e.to_string().contains("with_old(1"), "{e}");
}

/// A changed byte in the stored ciphertext is an authentication error, not a replay of garbage.
#[tokio::test]
async fn a_tampered_snapshot_fails_authentication() {
    let (inner, runs) = (sqlite().await, AtomicU32::new(0));
    let store = EncryptedStore::new(inner.clone(), Keyring::new(1, K1).unwrap());
    let first = pay(&store, &runs, "t").await.0.unwrap();
    let good = raw(&inner, "t").await;
    let mut bad = good.clone();
    let last = bad.len() - ENVELOPE_OVERHEAD / 2; // inside the ciphertext
    bad[last] ^= 0x40;
    overwrite_raw(&inner, "t", &bad).await;
    let (res, outcome) = pay(&store, &runs, "t").await;
    assert_eq!(decrypt_failure(res), DecryptFailure::Authentication);
    assert_eq!(outcome, Outcome::Rejected);
    overwrite_raw(&inner, "t", &good).await;
    assert_eq!(
        pay(&store, &runs, "t").await.0.unwrap(),
        first,
        "restored bytes open"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A ciphertext copied to another key's record does not open there: the associated data binds it
/// to its own `(biz, key)`.
#[tokio::test]
async fn a_snapshot_copied_to_another_record_is_refused() {
    let (inner, runs) = (sqlite().await, AtomicU32::new(0));
    let store = EncryptedStore::new(inner.clone(), Keyring::new(1, K1).unwrap());
    pay(&store, &runs, "alice").await.0.unwrap();
    let bob = pay(&store, &runs, "bob").await.0.unwrap();
    let bobs_own = raw(&inner, "bob").await;
    overwrite_raw(&inner, "bob", &raw(&inner, "alice").await).await;
    let (res, _) = pay(&store, &runs, "bob").await;
    assert_eq!(decrypt_failure(res), DecryptFailure::Authentication);
    overwrite_raw(&inner, "bob", &bobs_own).await;
    assert_eq!(pay(&store, &runs, "bob").await.0.unwrap(), bob);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A record written without encryption (before the wrapper was turned on) is said to be no
/// envelope.
#[tokio::test]
async fn a_plain_snapshot_is_not_an_envelope() {
    let (inner, runs) = (sqlite().await, AtomicU32::new(0));
    pay(&inner, &runs, "plain").await.0.unwrap();
    let store = EncryptedStore::new(inner.clone(), Keyring::new(1, K1).unwrap());
    let (res, _) = pay(&store, &runs, "plain").await;
    assert_eq!(decrypt_failure(res), DecryptFailure::NotAnEnvelope);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The snapshot limit leaves exactly the envelope's room: a result at the limit is stored and fills
/// the inner store's limit to the byte; one byte more is unstorable.
#[tokio::test]
async fn the_snapshot_limit_is_exact() {
    let inner = MemoryStore::new()
        .with_limits(Limits {
            max_snapshot_len: 200,
            ..Limits::default()
        })
        .unwrap();
    let store = EncryptedStore::new(inner, Keyring::new(1, K1).unwrap());
    assert_eq!(store.limits().max_snapshot_len, 200 - ENVELOPE_OVERHEAD);
    // `{"Ok":"…"}`: 9 bytes around the text.
    let fits = "x".repeat(200 - ENVELOPE_OVERHEAD - 9);
    let ok: Result<String, IdemError> = Call::new("SEAL", "fits")
        .run(&store, async { Ok(fits.clone()) })
        .await;
    assert_eq!(ok.unwrap(), fits);
    let sealed = store
        .inner()
        .load("SEAL", "fits")
        .await
        .unwrap()
        .unwrap()
        .snapshot
        .unwrap();
    assert_eq!(sealed.len(), 200);
    let again: Result<String, IdemError> = Call::new("SEAL", "fits")
        .run(&store, async { Ok(String::new()) })
        .await;
    assert_eq!(again.unwrap(), fits, "replayed");
    let over = format!("{fits}x");
    let res: Result<String, IdemError> = Call::new("SEAL", "over")
        .run(&store, async { Ok(over) })
        .await;
    assert!(
        matches!(res, Err(IdemError::ResultNotStorable { .. })),
        "{res:?}"
    );
}

#[idempotent(biz = "SEALTX", key = "order_no", tx = "tx")]
async fn pay_in_tx(tx: &mut EncryptedTx<SqliteStore>, order_no: &str) -> Result<Receipt, PayError> {
    sqlx::query("CREATE TABLE IF NOT EXISTS ledger (order_no TEXT NOT NULL)")
        .execute(tx.conn())
        .await
        .map_err(IdemError::store)?;
    sqlx::query("INSERT INTO ledger (order_no) VALUES (?1)")
        .bind(order_no)
        .execute(tx.conn())
        .await
        .map_err(IdemError::store)?;
    Ok(Receipt {
        order_no: order_no.to_owned(),
        note: SECRET.to_owned(),
        run: 0,
    })
}

/// Transaction mode through the attribute: the snapshot is sealed in the transaction and opened
/// on replay; the business wrote once.
#[tokio::test]
async fn a_transactional_call_seals_its_snapshot() {
    let inner = sqlite().await;
    let store = EncryptedStore::new(inner.clone(), Keyring::new(5, K2).unwrap());
    let mut tx = store.begin().await.unwrap();
    let first = pay_in_tx(&mut tx, "T-1").await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.begin().await.unwrap();
    let (again, report) = idem::metrics::observe(pay_in_tx(&mut tx, "T-1")).await;
    tx.commit().await.unwrap();
    assert_eq!(again.unwrap(), first);
    assert!(report.unwrap().replayed());
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ledger")
        .fetch_one(inner.pool())
        .await
        .unwrap();
    assert_eq!(rows, 1);
    let sealed = inner
        .load("SEALTX", "T-1")
        .await
        .unwrap()
        .unwrap()
        .snapshot
        .unwrap();
    assert_eq!(Keyring::key_id_of(&sealed).unwrap(), 5);
    assert!(!contains(&sealed, SECRET));
}

/// `with_limits` on the encrypted store narrows within the inner store's limits, the envelope
/// counted: a snapshot limit that leaves the envelope room is taken, one byte more is refused
/// naming the bound, and so is a key longer than the inner store takes.
#[tokio::test]
async fn with_limits_leaves_room_for_the_envelope() {
    let inner = MemoryStore::new()
        .with_limits(Limits {
            max_snapshot_len: 200,
            max_key_len: 64,
            ..Limits::default()
        })
        .unwrap();
    let store = EncryptedStore::new(inner, Keyring::new(1, K1).unwrap());
    let narrower = store
        .clone()
        .with_limits(Limits {
            max_snapshot_len: 100,
            max_key_len: 8,
            ..Limits::default()
        })
        .unwrap();
    assert_eq!(narrower.limits().max_snapshot_len, 100);
    let long_key: Result<u8, IdemError> = Call::new("SEAL", "123456789")
        .run(&narrower, async { Ok(1) })
        .await;
    assert!(
        matches!(long_key, Err(IdemError::InvalidKey { .. })),
        "{long_key:?}"
    );
    let at_room = store
        .clone()
        .with_limits(Limits {
            max_snapshot_len: 200 - ENVELOPE_OVERHEAD,
            max_key_len: 64,
            ..Limits::default()
        })
        .unwrap();
    assert_eq!(at_room.limits(), store.limits());
    for (limits, names) in [
        (
            Limits {
                max_snapshot_len: 200 - ENVELOPE_OVERHEAD + 1,
                max_key_len: 64,
                ..Limits::default()
            },
            format!("max_snapshot_len = {}", 200 - ENVELOPE_OVERHEAD + 1),
        ),
        (
            Limits {
                max_key_len: 65,
                ..Limits::default()
            },
            "max_key_len = 65".to_owned(),
        ),
    ] {
        let err = store.clone().with_limits(limits).unwrap_err();
        assert!(matches!(err, IdemError::InvalidOptions { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(&names) && text.contains("envelope"), "{text}");
    }
}
