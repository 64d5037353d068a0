//! Transactions on Postgres: [`PgTx`], on which `tx = "…"` calls claim in a savepoint and state
//! transitions run. The transaction is `sql/tx.rs`'s; here is what Postgres does its own way: the
//! claim's advisory lock, its lock timeout and its idle bound.

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Postgres, Row};

use super::records::Claiming;
use super::{PgStore, db_error, lock_timeout_text};
use crate::sql::claim::{claim_insert_first, replay_by_read};
use crate::sql::dialect::Savepoint;
use crate::sql::tx::{SqlTx, TxDb};
use crate::store::{ClaimOutcome, ClaimRequest};
use crate::{Busy, IdemError};

/// The isolation level of a transaction begun with [`PgStore::begin_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PgIsolation {
    /// `READ COMMITTED` (Postgres's default): each statement sees what was committed before it.
    ReadCommitted,
    /// `REPEATABLE READ`: one snapshot for the whole transaction; a claim meeting a record written
    /// after it is a serialization failure (run the transaction again).
    RepeatableRead,
    /// `SERIALIZABLE`: as REPEATABLE READ, and the commit may fail with a serialization failure.
    Serializable,
}

impl PgIsolation {
    pub(super) fn begin_statement(self) -> &'static str {
        match self {
            PgIsolation::ReadCommitted => "BEGIN ISOLATION LEVEL READ COMMITTED",
            PgIsolation::RepeatableRead => "BEGIN ISOLATION LEVEL REPEATABLE READ",
            PgIsolation::Serializable => "BEGIN ISOLATION LEVEL SERIALIZABLE",
        }
    }
}

/// A transaction on a [`PgStore`]'s database, begun with [`PgStore::begin`] or
/// [`PgStore::begin_with`].
///
/// It carries its store, so a `#[idempotent(tx = "tx")]` call claims in that store's table, on
/// that database, by construction. It derefs to the connection: run your own queries on it with
/// `query.execute(&mut **tx)`, exactly as on a `sqlx::Transaction`. Commit it (or let it drop to
/// roll back).
///
/// A claim in it is a savepoint, then one statement. While the store's claims mostly create
/// records, [`PgStore::begin`] opens the savepoint of the transaction's first claim in the round
/// trip of its `BEGIN`, and it serves that claim when nothing ran on the connection between them
/// (anything run through it, a read included, makes the claim open a savepoint of its own, so the
/// claim's undo never takes back the caller's own writes). The claim takes the key's
/// transaction-level advisory lock (`pg_try_advisory_xact_lock` on a hash of the table, business
/// type and key, held to the transaction's end). A new key is one statement: the insert (skipping
/// on a conflict) of a row kept only if that lock was free. When it inserts nothing, a second
/// statement takes the lock again, reads the record with a locking read (`FOR UPDATE`: the current
/// row, not the transaction's snapshot) and, when there is none, inserts it the same way. A
/// concurrent duplicate finds the lock taken and waits for the claimant's transaction at most the
/// store's lock timeout (`SET LOCAL lock_timeout` around that claim, the caller's own setting
/// restored after it), then answers `InProgress`; once the claimant committed it replays. A claim
/// that gets the lock at once cannot wait on another claimant, so it leaves the caller's lock
/// timeout alone. A deadlock or a serialization
/// failure is [`IdemError::StoreBusy`] with [`IdemError::restarts_transaction`]: run the whole
/// transaction again ([`crate::retry_transaction`]).
///
/// A claim also puts in force, for the rest of the transaction, its call's idle bound
/// ([`crate::TxIdleTimeout`], the lease by default):
/// `set_config('idle_in_transaction_session_timeout', …, true)` inside the claim's own statement
/// (no statement of its own), undone with the claim's savepoint when the claim takes nothing. A transaction that then sits idle longer is ended by
/// the server (25P03) and rolls back, so a client that vanished mid-transaction frees its key.
///
/// Once the store's claims mostly meet a record, a claim first reads it with a plain `SELECT`,
/// before any savepoint: a live success replays (or is a mismatch) without one. An error of that
/// read (the connection lost, the table missing, your `statement_timeout`) is not inside a
/// savepoint, so Postgres has aborted the transaction: run it again. Every other error of a claim
/// is undone to its savepoint and leaves the transaction as it was.
pub type PgTx = SqlTx<Postgres>;

/// Transaction mode: the claim lives in a savepoint of this transaction; a concurrent duplicate
/// waits (bounded) on the claimant's row, then replays.
#[async_trait]
impl TxDb for Postgres {
    type Store = PgStore;
    type State = ();
    const TX_NAME: &'static str = "PgTx";
    const TIMED: bool = true;
    const KEEPS_DONE: bool = true;
    const UNDO_BATCHED: bool = true;
    const MARKS_AT_COMMIT: bool = false;

    async fn claim(tx: &mut PgTx, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        // A live success needs no savepoint: one plain read answers it (once repeats prevail).
        let order = tx.store.order.clone();
        let mut records = tx.store.claims(&mut tx.tx, Claiming::Tx);
        if let Some(outcome) = replay_by_read(&mut records, req, &order).await? {
            return Ok(outcome);
        }
        // The savepoint opened with BEGIN, if nothing ran since; else one of its own.
        let (savepoint, opened) = match tx.ready.take() {
            Some(ready) => (ready, true),
            None => (Savepoint::claim(), false),
        };
        let outcome = claim_in(tx, &savepoint, req, opened).await;
        match outcome {
            Ok(outcome @ ClaimOutcome::Acquired { .. }) => {
                tx.claim = Some(savepoint);
                Ok(outcome)
            }
            Ok(outcome) => {
                // Nothing was written; the read's row lock and the lock timeout go with it.
                tx.undo(&savepoint).await?;
                Ok(outcome)
            }
            Err(e) => {
                // After an error Postgres refuses every statement until the savepoint is rolled
                // back; that also leaves the caller's transaction as it was before the call.
                let _ = tx.undo(&savepoint).await;
                match e {
                    IdemError::StoreBusy {
                        reason: Busy::LockTimeout,
                        ..
                    } => Ok(ClaimOutcome::InProgress {
                        retry_after: tx.store.lock_timeout,
                    }),
                    e => Err(e),
                }
            }
        }
    }
}

/// The claim itself, inside its savepoint: first under the key's advisory lock when no other
/// transaction holds it (no wait is possible, so the caller's lock timeout stays as it is); else
/// waiting for that transaction at most the store's lock timeout.
async fn claim_in(
    tx: &mut PgTx,
    savepoint: &Savepoint,
    req: &ClaimRequest<'_>,
    opened: bool,
) -> Result<ClaimOutcome, IdemError> {
    if !opened {
        let open = savepoint.open_after(tx.done.take());
        tx.exec(open).await?;
    }
    // The idle bound goes in the claim's statements (`idle_in_transaction_session_timeout`
    // for this transaction only, undone with the savepoint when the claim takes nothing).
    let idle = tx.idle.unwrap_or(tx.store.tx_idle).bound(req.lease);
    let store = &tx.store;
    let mut records = store.claims(&mut tx.tx, Claiming::Tx).bounding_idle(idle);
    let outcome = claim_insert_first(&mut records, req, &store.order).await;
    if !records.contended() {
        return outcome;
    }
    // One round trip: the caller's lock timeout, and the claim's.
    let rows = sqlx::raw_sql(AssertSqlSafe(format!(
        "SHOW lock_timeout; SET LOCAL lock_timeout = '{}'",
        lock_timeout_text(store.lock_timeout)
    )))
    .fetch_all(&mut *tx.tx)
    .await
    .map_err(db_error)?;
    let callers: String = match rows.first() {
        Some(row) => row.try_get(0).map_err(db_error)?,
        None => return Err(IdemError::store("SHOW lock_timeout returned no row")),
    };
    let outcome = claim_insert_first(
        &mut store
            .claims(&mut tx.tx, Claiming::TxWaiting)
            .bounding_idle(idle),
        req,
        &store.order,
    )
    .await?;
    if let ClaimOutcome::Acquired { .. } = outcome {
        // The body's own statements wait as long as the caller said.
        sqlx::query("SELECT set_config('lock_timeout', $1, true)")
            .bind(callers)
            .execute(&mut *tx.tx)
            .await
            .map_err(db_error)?;
    }
    Ok(outcome)
}
