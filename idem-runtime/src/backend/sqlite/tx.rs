//! Transactions on SQLite: [`SqliteTx`], on which `tx = "…"` calls claim in a savepoint and state
//! transitions run. The transaction is `sql/tx.rs`'s; here is what SQLite does its own way:
//! `BEGIN IMMEDIATE` already holds the write lock, so a claim needs no waiting of its own.

use async_trait::async_trait;
use sqlx::Sqlite;

use super::SqliteStore;
use super::records::Claims;
use crate::IdemError;
use crate::engine::tx::IdemTx;
use crate::sql::claim::{claim_insert_first, replay_by_read};
use crate::sql::dialect::Savepoint;
use crate::sql::store::SqlStore;
use crate::sql::tx::{SqlTx, TxDb};
use crate::store::{ClaimOutcome, ClaimRequest};

/// A transaction on a [`SqliteStore`]'s database, begun with [`SqliteStore::begin`]
/// (`BEGIN IMMEDIATE`).
///
/// It carries its store, so a `#[idempotent(tx = "tx")]` call claims in that store's table, on
/// that database, by construction. It derefs to the connection: run your own queries on it with
/// `query.execute(&mut **tx)`, exactly as on a `sqlx::Transaction`. Commit it (or let it drop to
/// roll back).
pub type SqliteTx = SqlTx<Sqlite>;

/// Transaction mode: the claim lives in a savepoint of this transaction. `BEGIN IMMEDIATE` holds
/// SQLite's write lock, so a concurrent duplicate's `begin()` waits for this one to commit, then
/// replays.
///
/// A claim costs one statement beyond its own: the savepoint, opened with the `BEGIN` for the
/// transaction's first claim when nothing ran between them, else sent with the release of the last
/// claim marked done. A claim marked done keeps its savepoint, released with the next claim's or
/// by the commit; a claim that took nothing keeps its (empty) savepoint the same way.
///
/// The mark waits for what the transaction sends next, as nothing outside it can reach the
/// claimed record before its commit: it goes ahead of the next claim, or with the `COMMIT` in
/// one round trip, where a check between them stops the `COMMIT` if the mark changed nothing
/// (the transaction's own statements deleted or changed the record): `commit()` then returns
/// [`IdemError::LeaseLost`] and the transaction rolls back. A first execution in a transaction
/// of its own thus costs four round trips: `BEGIN IMMEDIATE` with the savepoint, the claim, the
/// body's own statements, and the mark with the `COMMIT`.
#[async_trait]
impl TxDb for Sqlite {
    type Store = SqliteStore;
    type State = ();
    const TX_NAME: &'static str = "SqliteTx";
    const TIMED: bool = false;
    const KEEPS_DONE: bool = true;
    const UNDO_BATCHED: bool = true;
    const MARKS_AT_COMMIT: bool = true;

    async fn claim(tx: &mut SqliteTx, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        // A live success needs no savepoint: one plain read answers it (once repeats prevail).
        let order = tx.store.order.clone();
        if let Some(outcome) = replay_by_read(
            &mut Claims::new(tx.store.records(&mut tx.tx), &tx.store.sql),
            req,
            &order,
        )
        .await?
        {
            return Ok(outcome);
        }
        // The savepoint opened with BEGIN, if nothing ran since; else one of its own, opened
        // with the release of the last claim marked done.
        let savepoint = match tx.ready.take() {
            Some(ready) => ready,
            None => {
                let savepoint = Savepoint::claim();
                let open = savepoint.open_after(tx.done.take());
                tx.exec(open).await?;
                savepoint
            }
        };
        tx.claim = Some(savepoint);
        let outcome = claim_insert_first(
            &mut Claims::new(tx.store.records(&mut tx.tx), &tx.store.sql),
            req,
            &order,
        )
        .await;
        match outcome {
            Ok(outcome @ ClaimOutcome::Acquired { .. }) => Ok(outcome),
            Ok(outcome) => {
                // Nothing was written: the savepoint is released with the next claim's, or by
                // the commit.
                tx.done = tx.claim.take();
                Ok(outcome)
            }
            Err(e) => {
                let _ = IdemTx::abort(tx).await;
                Err(e)
            }
        }
    }
}
