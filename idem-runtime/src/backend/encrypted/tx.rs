//! A transaction of the inner store whose snapshots are sealed, for `tx = "…"` calls.

use std::time::Duration;

use async_trait::async_trait;

use super::EncryptedStore;
use crate::store::tx::StoreTx;
use crate::store::{Claim, ClaimOutcome, ClaimRequest, Store};
use crate::{IdemError, IdemTx, TransactionalStore};

/// A transaction on the inner store's database, from [`EncryptedStore::begin`]: a `tx = "…"` call
/// in it seals its snapshot and opens the one it replays, like a lease-mode call on the
/// [`EncryptedStore`]. Its `conn()` is the inner transaction's connection, for the business's
/// own queries (`query.execute(tx.conn())`); [`EncryptedTx::commit`] and [`EncryptedTx::rollback`] end it.
pub struct EncryptedTx<S: TransactionalStore> {
    tx: S::Tx,
    store: EncryptedStore<S>,
}

impl<S: TransactionalStore> EncryptedTx<S> {
    pub(super) fn new(tx: S::Tx, store: EncryptedStore<S>) -> Self {
        EncryptedTx { tx, store }
    }

    /// The inner store's transaction.
    pub fn into_inner(self) -> S::Tx {
        self.tx
    }

    /// The inner store's transaction.
    pub fn inner_mut(&mut self) -> &mut S::Tx {
        &mut self.tx
    }

    /// Commits the inner transaction.
    ///
    /// # Errors
    /// The inner store's error.
    pub async fn commit(self) -> Result<(), IdemError>
    where
        S::Tx: StoreTx,
    {
        Box::new(self.tx).commit().await
    }

    /// Rolls the inner transaction back.
    ///
    /// # Errors
    /// The inner store's error.
    pub async fn rollback(self) -> Result<(), IdemError>
    where
        S::Tx: StoreTx,
    {
        Box::new(self.tx).rollback().await
    }
}

#[async_trait]
impl<S: TransactionalStore> IdemTx for EncryptedTx<S> {
    /// The [`EncryptedStore`]: its limits leave room for the envelope.
    fn store(&self) -> &dyn Store {
        &self.store
    }

    fn idle_timeout(&mut self, call: Option<crate::TxIdleTimeout>) {
        self.tx.idle_timeout(call);
    }

    async fn claim(&mut self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        let outcome = self.tx.claim(req).await?;
        self.store.open_outcome(req, outcome)
    }

    async fn complete(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
    ) -> Result<(), IdemError> {
        let sealed = self.store.keyring().seal(biz, key, snapshot)?;
        self.tx.complete(biz, key, claim, &sealed, ttl).await
    }

    async fn complete_keeping(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Duration,
    ) -> Result<(), IdemError> {
        let sealed = self.store.keyring().seal(biz, key, snapshot)?;
        self.tx
            .complete_keeping(biz, key, claim, &sealed, ttl, result_ttl)
            .await
    }

    async fn abort(&mut self) -> Result<(), IdemError> {
        self.tx.abort().await
    }
}

// Not offered in the "not a transaction" error, whose list should show the stores' own
// transactions (and read the same with and without the `encrypt` feature).
crate::sql::conn::wrapping_transition_tx!(EncryptedTx, #[diagnostic::do_not_recommend]);
