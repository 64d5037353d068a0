//! `EncryptedStore`: any store, with its result snapshots encrypted before they reach it (feature
//! `encrypt`). The records' status, fences, leases and fingerprints stay readable, so the backend
//! decides claims as before; only what a call returned is sealed.

mod envelope;
mod tx;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::store::tx::TransitionTx;
use crate::store::{Claim, ClaimOutcome, ClaimRequest, Limits, Record, Store};
use crate::{IdemError, TransactionalStore};
pub use envelope::{ENVELOPE_OVERHEAD, Keyring};
pub use tx::EncryptedTx;

/// A store whose result snapshots are encrypted (XChaCha20-Poly1305) with keys the service holds,
/// so whoever reads the database, a backup or a Redis dump does not read what the calls returned.
///
/// It wraps any [`Store`] and changes no backend: `complete` seals the snapshot, a replay and
/// `load` open it. Each snapshot carries the id of the key that sealed it (see [`Keyring`] for
/// rotation) and is bound to its `(biz, key)`: a ciphertext copied to another record, or altered,
/// is refused with [`IdemError::SnapshotDecrypt`], never replayed as garbage, and the call does not
/// run again. Its [`Store::limits`] are the inner store's with [`ENVELOPE_OVERHEAD`] taken off the
/// snapshot limit, so a result that passes the engine's size check also fits once sealed.
///
/// Over a store with transactions it has them too (`begin()`, an [`EncryptedTx`] for `tx = "…"`
/// calls; a [`ShardedStore`](crate::ShardedStore)'s `begin_for` is not wrapped: lease mode only
/// there). Status, fences, leases, keys and fingerprints are not encrypted (the fingerprint is
/// already a hash), so claims are decided as before. Feature `encrypt`.
///
/// - **Envelope** (what the inner store keeps): `IDEM` (4 bytes), format version `1` (1 byte),
///   the key id (u32 big-endian), a random 24-byte nonce, then the ciphertext and its 16-byte tag:
///   [`ENVELOPE_OVERHEAD`] (49) bytes more than the snapshot.
/// - **Bound to its record.** The associated data is the header plus `(biz, key)`.
/// - **Rotation.** New writes use the current key; a record under a retired key opens while that
///   key is in the keyring. Drop a key only after its records expired (their TTL after the
///   rotation); [`Keyring::key_id_of`] on the inner store's `load` says which key sealed a record.
/// - **Refusals, never garbage.** A snapshot under a key the keyring does not hold, one that fails
///   authentication, or one that is no envelope (written before encryption was on) is
///   [`IdemError::SnapshotDecrypt`] with a [`DecryptFailure`](crate::error::DecryptFailure) that says
///   which (500, not retryable); the body does not run again and the record is left as it is.
/// - Keys must be exactly 32 bytes (else an error at construction); they are zeroized when the
///   keyring is dropped, and `Debug` shows only their ids. Neither keys nor snapshots are logged.
///
/// Registered like any store:
///
/// ```no_run
/// # use idem_runtime as idem;
/// # #[cfg(feature = "sqlite")]
/// # async fn demo(current_key: [u8; 32], retired_key: [u8; 32]) -> Result<(), idem::IdemError> {
/// use idem::{EncryptedStore, Keyring, SqliteStore};
///
/// let store = SqliteStore::open("idem.db").await?;
/// store.migrate().await?;
/// // 32-byte keys from your secret manager; the id is stored with every snapshot.
/// let keyring = Keyring::new(2, current_key)? // seals every new snapshot
///     .with_old(1, retired_key)?;            // still opens snapshots sealed under key 1
/// idem::register_store("sqlite", EncryptedStore::new(store, keyring));
/// # Ok(()) }
/// ```
///
/// ```
/// # use idem_runtime as idem;
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// use idem::{Call, EncryptedStore, IdemError, Keyring, MemoryStore, Store};
/// let keyring = Keyring::new(1, [42u8; 32])?; // in real life: 32 bytes from a secret manager
/// let store = EncryptedStore::new(MemoryStore::new(), keyring);
/// let first: Result<String, IdemError> =
///     Call::new("PAY", "order-1").run(&store, async { Ok("receipt 7".to_owned()) }).await;
/// let again: Result<String, IdemError> =
///     Call::new("PAY", "order-1").run(&store, async { Ok("never runs".to_owned()) }).await;
/// assert_eq!(first?, again?);
/// let raw = store.inner().load("PAY", "order-1").await?.unwrap().snapshot.unwrap();
/// assert!(!String::from_utf8_lossy(&raw).contains("receipt 7"));
/// # Ok(()) }
/// ```
pub struct EncryptedStore<S> {
    inner: Arc<Inner<S>>,
    limits: Limits,
}

struct Inner<S> {
    store: S,
    keyring: Keyring,
}

impl<S> Clone for EncryptedStore<S> {
    fn clone(&self) -> Self {
        EncryptedStore {
            inner: self.inner.clone(),
            limits: self.limits.clone(),
        }
    }
}

impl<S: Store> EncryptedStore<S> {
    /// Wraps `store`: new snapshots are sealed under the keyring's current key; snapshots under
    /// any key it holds open. To rotate keys, build a new `EncryptedStore` over the same store (a
    /// clone of it) with the new keyring and register that one.
    pub fn new(store: S, keyring: Keyring) -> Self {
        let limits = sealed_room(store.limits());
        EncryptedStore {
            inner: Arc::new(Inner { store, keyring }),
            limits,
        }
    }

    /// The same store with other limits, on the plain snapshot (what a call returns), checked
    /// against the inner store's: a business type and a key of at most the inner store's limits,
    /// a snapshot of at most the inner store's snapshot limit less [`ENVELOPE_OVERHEAD`] (so a
    /// snapshot at the limit still fits once sealed). To raise them, raise the inner store's
    /// limits first (its `with_limits`) and wrap it again; this only narrows.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] naming the limit the inner store cannot hold and the bound.
    pub fn with_limits(mut self, limits: Limits) -> Result<Self, IdemError> {
        let room = sealed_room(self.inner.store.limits());
        let holder = format!(
            "the inner {} store (its limits, less the {ENVELOPE_OVERHEAD}-byte envelope on a \
             snapshot)",
            self.inner.store.backend()
        );
        crate::store::check_limits(&holder, &limits, &room)?;
        self.limits = limits;
        Ok(self)
    }

    /// The wrapped store: what it returns is sealed (for inspection, e.g. with
    /// [`Keyring::key_id_of`]).
    pub fn inner(&self) -> &S {
        &self.inner.store
    }

    /// The keyring.
    pub fn keyring(&self) -> &Keyring {
        &self.inner.keyring
    }

    /// `record` with its snapshot opened, as sealed for `(biz, key)`.
    fn open_record(&self, biz: &str, key: &str, mut record: Record) -> Result<Record, IdemError> {
        if let Some(sealed) = record.snapshot.take() {
            record.snapshot = Some(self.inner.keyring.open(biz, key, &sealed)?);
        }
        if let Some(sealed) = record.steps.take() {
            record.steps = Some(self.inner.keyring.open(biz, key, &sealed)?);
        }
        Ok(record)
    }

    fn open_outcome(
        &self,
        req: &ClaimRequest<'_>,
        outcome: ClaimOutcome,
    ) -> Result<ClaimOutcome, IdemError> {
        match outcome {
            ClaimOutcome::Replay { snapshot } => Ok(ClaimOutcome::Replay {
                snapshot: self.inner.keyring.open(req.biz, req.key, &snapshot)?,
            }),
            other => Ok(other),
        }
    }
}

/// The plain-snapshot limits a store with `inner` limits leaves: its snapshot limit less the
/// envelope.
fn sealed_room(inner: &Limits) -> Limits {
    let mut limits = inner.clone();
    limits.max_snapshot_len = limits.max_snapshot_len.saturating_sub(ENVELOPE_OVERHEAD);
    limits
}

impl<S: TransactionalStore> EncryptedStore<S> {
    /// Begins a transaction on the inner store's database, for `tx = "…"` calls whose snapshots
    /// are sealed like those of lease-mode calls.
    ///
    /// # Errors
    /// The inner store's error.
    pub async fn begin(&self) -> Result<EncryptedTx<S>, IdemError> {
        let tx = self.inner.store.begin_tx().await?;
        Ok(EncryptedTx::new(tx, self.clone()))
    }
}

impl<S> std::fmt::Debug for EncryptedStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptedStore")
            .field("keyring", &self.inner.keyring)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<S: Store> Store for EncryptedStore<S> {
    /// The inner store's backend.
    fn backend(&self) -> &'static str {
        self.inner.store.backend()
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        let outcome = self.inner.store.claim(req).await?;
        self.open_outcome(req, outcome)
    }

    async fn claim_batch(
        &self,
        batch: &crate::store::BatchClaim<'_>,
    ) -> Result<Vec<ClaimOutcome>, IdemError> {
        let outcomes = self.inner.store.claim_batch(batch).await?;
        batch
            .requests()
            .zip(outcomes)
            .map(|(req, outcome)| self.open_outcome(&req, outcome))
            .collect()
    }

    async fn processing_biz_types(&self) -> Result<Vec<String>, IdemError> {
        self.inner.store.processing_biz_types().await
    }

    /// Each result sealed under its own key, then one batch of marks on the inner store.
    async fn complete_batch(
        &self,
        biz: &str,
        marks: &[crate::store::BatchMark<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<(), IdemError>>, IdemError> {
        let sealed = marks
            .iter()
            .map(|m| self.inner.keyring.seal(biz, m.key, m.snapshot))
            .collect::<Result<Vec<_>, _>>()?;
        let marks: Vec<crate::store::BatchMark<'_>> = marks
            .iter()
            .zip(&sealed)
            .map(|(m, sealed)| crate::store::BatchMark {
                snapshot: sealed,
                ..*m
            })
            .collect();
        self.inner.store.complete_batch(biz, &marks, ttl).await
    }

    async fn complete(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
    ) -> Result<(), IdemError> {
        let sealed = self.inner.keyring.seal(biz, key, snapshot)?;
        self.inner
            .store
            .complete(biz, key, claim, &sealed, ttl)
            .await
    }

    async fn complete_keeping(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Duration,
    ) -> Result<(), IdemError> {
        let sealed = self.inner.keyring.seal(biz, key, snapshot)?;
        self.inner
            .store
            .complete_keeping(biz, key, claim, &sealed, ttl, result_ttl)
            .await
    }

    async fn fail(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        self.inner.store.fail(biz, key, claim).await
    }

    async fn renew(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        self.inner.store.renew(biz, key, claim, lease).await
    }

    /// Seals the steps as a snapshot is sealed: what a body's steps returned is as private as
    /// what the body returns.
    async fn save_steps(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        let sealed = self.inner.keyring.seal(biz, key, steps)?;
        self.inner.store.save_steps(biz, key, claim, &sealed).await
    }

    /// The record with its snapshot (or saved steps) opened.
    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        let Some(record) = self.inner.store.load(biz, key).await? else {
            return Ok(None);
        };
        self.open_record(biz, key, record).map(Some)
    }

    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        self.inner.store.sweep_expired(batch).await
    }

    /// The inner store's stuck records, each opened as [`Store::load`] opens it (their saved
    /// steps, if any).
    async fn stuck(&self, biz: &str, batch: usize) -> Result<Vec<Record>, IdemError> {
        let stuck = self.inner.store.stuck(biz, batch).await?;
        stuck
            .into_iter()
            .map(|r| {
                let key = r.key.clone();
                self.open_record(biz, &key, r)
            })
            .collect()
    }

    /// The inner store's counts (business types and statuses are not sealed).
    async fn stats(&self) -> Result<Vec<crate::StatusCount>, IdemError> {
        self.inner.store.stats().await
    }

    /// The inner store's walk, its cursor as it is: business types and keys are stored as given
    /// (only snapshots and steps are sealed), so the keys listed are the callers' own.
    async fn list_keys(
        &self,
        after: Option<&str>,
        batch: usize,
    ) -> Result<crate::store::KeyPage, IdemError> {
        self.inner.store.list_keys(after, batch).await
    }

    async fn begin_transition(&self) -> Result<Box<dyn TransitionTx>, IdemError> {
        self.inner.store.begin_transition().await
    }
}

impl<S: TransactionalStore> TransactionalStore for EncryptedStore<S> {
    type Tx = EncryptedTx<S>;

    fn begin_tx(&self) -> impl Future<Output = Result<Self::Tx, IdemError>> + Send {
        self.begin()
    }
}
