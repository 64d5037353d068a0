//! Transactions on MySQL / MariaDB: [`MySqlTx`], on which `tx = "…"` calls claim in a savepoint and
//! state transitions run. The transaction is `sql/tx.rs`'s; here is what MySQL does its own way:
//! the claim's savepoint and idle bound sent with its insert, and InnoDB's deadlock victims.

use async_trait::async_trait;
use sqlx::MySql;

use super::MySqlStore;
use crate::engine::tx::IdemTx;
use crate::sql::claim::{claim_insert_first, replay_by_read};
use crate::sql::dialect::Savepoint;
use crate::sql::tx::{SqlTx, TxDb};
use crate::store::{ClaimOutcome, ClaimRequest};
use crate::{Busy, IdemError};

/// A transaction on a [`MySqlStore`]'s database, begun with [`MySqlStore::begin`].
///
/// It carries its store, so a `#[idempotent(tx = "tx")]` call claims in that store's table, on
/// that database, by construction. It derefs to the connection: run your own queries on it with
/// `query.execute(&mut **tx)`, exactly as on a `sqlx::Transaction`. Commit it (or let it drop to
/// roll back).
///
/// A claim in it is a plain `INSERT` in a savepoint. While the store's claims mostly create
/// records, [`MySqlStore::begin`] opens the savepoint of the transaction's first claim in the round
/// trip of its `BEGIN`, and it serves that claim (whose insert then goes as a prepared statement)
/// when nothing ran on the connection between them; anything run through it, a read included,
/// makes the claim open a savepoint of its own, so the claim's undo never takes back the caller's
/// own writes. Such a savepoint is sent with the insert in one round trip (as text, its strings as
/// hexadecimal literals). Once the store's claims mostly meet a record, a plain read comes first
/// and answers a live success without a savepoint. A savepoint stays until
/// the next claim's or the commit releases it. A duplicate waits (up to the store's lock
/// wait) for the transaction that holds the key, then reads the committed record with a current
/// read and replays it, or answers `InProgress` when the wait ran out. When InnoDB picks the
/// claim as a deadlock victim it has rolled back the whole transaction: the call fails with an
/// error whose `restarts_transaction()` is true; run the transaction again
/// ([`crate::retry_transaction`]).
///
/// Once it holds a claim, MariaDB closes its connection after it sat idle longer than the call's
/// idle bound ([`crate::TxIdleTimeout`], the lease by default: `idle_write_transaction_timeout`,
/// set by [`MySqlStore::begin`] and, for a call that asks for another, in the claim's round
/// trip), and the transaction rolls back, so a client that vanished mid-transaction frees its
/// key.
pub type MySqlTx = SqlTx<MySql>;

/// The statement that sets the idle bound `req`'s call asks for, when the session has another
/// (sent in the claim's round trip). `tx.state` is the session's `idle_write_transaction_timeout`
/// as idem last set it (`begin`, or a claim).
fn idle_settings(tx: &mut MySqlTx, req: &ClaimRequest<'_>) -> Option<String> {
    let bound = tx.idle.unwrap_or(tx.store.tx_idle).bound(req.lease);
    let wanted = super::idle_setting(bound);
    if wanted == tx.state {
        return None;
    }
    let set = tx.store.session_settings(&wanted);
    tx.state = wanted;
    Some(set)
}

#[async_trait]
impl TxDb for MySql {
    type Store = MySqlStore;
    /// The session's `idle_write_transaction_timeout` as idem last set it.
    type State = String;
    const TX_NAME: &'static str = "MySqlTx";
    const TIMED: bool = true;
    const KEEPS_DONE: bool = true;
    const UNDO_BATCHED: bool = false;
    const MARKS_AT_COMMIT: bool = false;

    /// InnoDB rolled the whole transaction back (the savepoint is gone with it).
    fn keeps_savepoint(e: &IdemError) -> bool {
        !e.restarts_transaction()
    }

    async fn claim(tx: &mut MySqlTx, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        // A live success needs no savepoint: one plain read answers it (once repeats prevail).
        let order = tx.store.order.clone();
        if let Some(outcome) =
            replay_by_read(&mut tx.store.claims(&mut tx.tx, true), req, &order).await?
        {
            return Ok(outcome);
        }
        // The savepoint opened with BEGIN, if nothing ran since; else one of its own, which goes
        // in the round trip of the claim's insert. So does the idle bound, when the call asks for
        // another than the session has (MariaDB has no transaction-local setting).
        let set = idle_settings(tx, req);
        let outcome = if let Some(ready) = tx.ready.take() {
            tx.claim = Some(ready);
            let records = tx.store.claims(&mut tx.tx, true);
            let mut records = match set {
                Some(set) => records.sending_first(set),
                None => records,
            };
            claim_insert_first(&mut records, req, &order).await
        } else {
            let savepoint = Savepoint::claim();
            let mut open = savepoint.open_after(tx.done.take());
            if let Some(set) = set {
                open = format!("{set}; {open}");
            }
            tx.claim = Some(savepoint);
            let mut records = tx.store.claims(&mut tx.tx, true).sending_first(open);
            claim_insert_first(&mut records, req, &order).await
        };
        match outcome {
            Ok(outcome @ ClaimOutcome::Acquired { .. }) => Ok(outcome),
            Ok(outcome) => {
                // Nothing was written in it: released with the next claim's, or by the commit.
                tx.done = tx.claim.take();
                Ok(outcome)
            }
            Err(e) if !Self::keeps_savepoint(&e) => {
                tx.claim = None;
                Err(e)
            }
            Err(IdemError::StoreBusy {
                reason: Busy::LockTimeout,
                ..
            }) => {
                // Another transaction still holds the record; only the statement was undone.
                IdemTx::abort(tx).await?;
                Ok(ClaimOutcome::InProgress {
                    retry_after: tx.store.lock_wait(),
                })
            }
            Err(e) => {
                let _ = IdemTx::abort(tx).await;
                Err(e)
            }
        }
    }
}
