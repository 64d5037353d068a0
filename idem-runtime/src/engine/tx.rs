//! Transaction mode: claim, business writes and mark in the caller's transaction.

use super::snapshot::{ErrType, OkType};
use super::{StoreArg, StoreHandle, acquired_outcome};
use crate::IdemError;
use crate::engine::call::Call;
use crate::engine::tx_conn::TxConnection;
use crate::metrics::{Outcome, report};
use crate::store::{Acquired, ClaimOutcome};

/// The claim a transactional call holds while its body runs.
pub struct TxGuard<'a> {
    store: StoreHandle<'a>,
    call: Call,
    attempt: u32,
    how: Acquired,
}

/// What a transactional claim found.
pub enum TxClaim<'a, T> {
    /// Run the body; finish with [`tx_finish`].
    Run(TxGuard<'a>),
    /// Already done in a committed transaction: this is its result.
    Replay(T),
}

/// Claims inside the caller's transaction (a savepoint).
///
/// # Errors
/// Refusals and store errors as for [`run`]; [`IdemError::TxStoreMismatch`] when the store is
/// not of the transaction's backend.
pub async fn tx_claim<'a, T, C>(
    store: StoreArg<'a>,
    call: Call,
    ok: OkType<T>,
    conn: &mut C,
) -> Result<TxClaim<'a, T>, IdemError>
where
    C: TxConnection + ?Sized,
{
    let refuse = |e: IdemError, outcome: Outcome, biz: &str| {
        report(biz, outcome, 0);
        Err(e)
    };
    let store = match store.resolve() {
        Ok(s) => s,
        Err(e) => return refuse(e, Outcome::Rejected, call.biz()),
    };
    let outcome = match call.request(store.get()) {
        Ok(req) => conn.idem_claim(store.get(), &req).await,
        Err(e) => Err(e),
    };
    match outcome {
        Ok(ClaimOutcome::Acquired { attempt, how }) => Ok(TxClaim::Run(TxGuard {
            store,
            call,
            attempt,
            how,
        })),
        Ok(ClaimOutcome::Replay { snapshot }) => match (ok.decode)(&snapshot) {
            Ok(v) => {
                report(call.biz(), Outcome::Replayed, 0);
                Ok(TxClaim::Replay(v))
            }
            Err(e) => refuse(e, Outcome::Replayed, call.biz()),
        },
        Ok(ClaimOutcome::Mismatch) => {
            refuse(IdemError::PayloadMismatch, Outcome::Mismatch, call.biz())
        }
        Ok(ClaimOutcome::InProgress { retry_after }) => refuse(
            IdemError::InProgress { retry_after },
            Outcome::InProgress,
            call.biz(),
        ),
        Err(e) => refuse(e, Outcome::Rejected, call.biz()),
    }
}

/// Marks the claim done with the body's result (same transaction), or rolls the claim and the
/// body's writes back to the savepoint when the body failed.
///
/// # Errors
/// The body's error, or an [`IdemError`] converted into `E`.
pub async fn tx_finish<T, E, C>(
    guard: TxGuard<'_>,
    conn: &mut C,
    ok: OkType<T>,
    err: ErrType<E>,
    out: Result<T, E>,
) -> Result<T, E>
where
    C: TxConnection + ?Sized,
{
    let TxGuard {
        store,
        call,
        attempt,
        how,
    } = guard;
    let (result, outcome) = match out {
        Ok(value) => {
            let (snapshot, result) =
                match (ok.encode)(&value, store.get().limits().max_snapshot_len) {
                    Ok(bytes) => (bytes, Ok(value)),
                    Err((envelope, e)) => (envelope, Err(err.from_idem(e))),
                };
            match conn
                .idem_complete(store.get(), call.biz(), call.key(), attempt, &snapshot)
                .await
            {
                Ok(()) => (result, acquired_outcome(how)),
                Err(e @ IdemError::LeaseLost { .. }) => (Err(err.from_idem(e)), Outcome::LeaseLost),
                Err(e) => (Err(err.from_idem(e)), Outcome::Rejected),
            }
        }
        Err(body_err) => {
            if let Err(e) = conn.idem_abort().await {
                tracing::warn!(error = %e, "could not roll the idempotent claim back to its savepoint");
            }
            (Err(body_err), Outcome::Failed)
        }
    };
    report(call.biz(), outcome, attempt);
    result
}
