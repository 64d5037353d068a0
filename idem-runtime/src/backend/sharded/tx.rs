//! A transaction on one shard, for `tx = "…"` calls whose key lives there.

use std::time::Duration;

use async_trait::async_trait;

use super::ShardedStore;
use crate::store::{Claim, ClaimOutcome, ClaimRequest, Store};
use crate::{IdemError, IdemTx, TransactionalStore};

/// A transaction on the shard of one key, from [`ShardedStore::begin_for`]. A `tx = "…"` call
/// claims in it only for a key of this shard (any other is refused before anything is written);
/// lease-mode calls and the sweeper find the record on the same shard. Its `conn()` is the shard's
/// connection, for your own queries (`query.execute(tx.conn())`); [`ShardedTx::into_inner`] gives
/// the shard's transaction to commit.
pub struct ShardedTx<S: TransactionalStore> {
    tx: S::Tx,
    store: ShardedStore<S>,
    shard: usize,
}

impl<S: TransactionalStore> ShardedTx<S> {
    pub(super) fn new(tx: S::Tx, store: ShardedStore<S>, shard: usize) -> Self {
        ShardedTx { tx, store, shard }
    }

    /// Refuses `(biz, key)` unless it lives on this transaction's shard now: a claim for a key of
    /// another shard, or a claim or mark while a reshard moves the key (the mark is checked
    /// again, so that a transaction begun before a move began cannot commit a record the move's
    /// copy missed).
    async fn on_this_shard(
        store: &ShardedStore<S>,
        shard: usize,
        biz: &str,
        key: &str,
        marking: bool,
    ) -> Result<(), IdemError> {
        let home = store.tx_shard(biz, key).await?;
        if home != shard && marking {
            // Claimed here, then a reshard moved the key: the copy may not have this record.
            return Err(IdemError::unavailable(format!(
                "({biz}, {key}) moved to shard {home} while this transaction on shard {shard} \
                 held it (a reshard): its mark is refused, so the transaction rolls back; retry"
            )));
        }
        if home != shard {
            return Err(IdemError::InvalidOptions {
                reason: format!(
                    "({biz}, {key}) lives on shard {home}, but this transaction is on shard {shard}: \
                     begin it with `begin_for(biz, key)` for the key the call claims"
                ),
            });
        }
        Ok(())
    }

    /// The index of the shard this transaction is on.
    pub fn shard(&self) -> usize {
        self.shard
    }

    /// The shard's transaction, e.g. to `commit()` it.
    pub fn into_inner(self) -> S::Tx {
        self.tx
    }

    /// The shard's transaction.
    pub fn inner_mut(&mut self) -> &mut S::Tx {
        &mut self.tx
    }
}

#[async_trait]
impl<S: TransactionalStore> IdemTx for ShardedTx<S> {
    fn store(&self) -> &dyn Store {
        &self.store
    }

    fn idle_timeout(&mut self, call: Option<crate::TxIdleTimeout>) {
        self.tx.idle_timeout(call);
    }

    async fn claim(&mut self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        Self::on_this_shard(&self.store, self.shard, req.biz, req.key, false).await?;
        self.tx.claim(req).await
    }

    async fn complete(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
    ) -> Result<(), IdemError> {
        Self::on_this_shard(&self.store, self.shard, biz, key, true).await?;
        self.tx.complete(biz, key, claim, snapshot, ttl).await
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
        Self::on_this_shard(&self.store, self.shard, biz, key, true).await?;
        self.tx
            .complete_keeping(biz, key, claim, snapshot, ttl, result_ttl)
            .await
    }

    async fn abort(&mut self) -> Result<(), IdemError> {
        self.tx.abort().await
    }
}

// Not offered in the "not a transaction" error, whose list should show the stores' own
// transactions (a shard's `begin_for` gives this one).
crate::sql::conn::wrapping_transition_tx!(ShardedTx, #[diagnostic::do_not_recommend]);
