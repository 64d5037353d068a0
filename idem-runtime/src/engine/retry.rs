//! Running a transaction again when the database rolled it back.

use std::future::Future;

use crate::IdemError;

/// An error that can say "the database rolled the transaction back: run it again" (a deadlock
/// victim, a serialization failure). Implemented for [`IdemError`]; implement it for the error
/// type of your transactions, usually by asking the `IdemError` inside:
///
/// ```
/// # use idem_runtime as idem;
/// #[derive(Debug, thiserror::Error)]
/// enum PayError {
///     #[error(transparent)]
///     Idem(#[from] idem::IdemError),
/// }
///
/// impl idem::RestartsTransaction for PayError {
///     fn restarts_transaction(&self) -> bool {
///         matches!(self, PayError::Idem(e) if e.restarts_transaction())
///     }
/// }
/// ```
pub trait RestartsTransaction {
    /// Whether the whole transaction must run again.
    fn restarts_transaction(&self) -> bool;
}

impl RestartsTransaction for IdemError {
    fn restarts_transaction(&self) -> bool {
        IdemError::restarts_transaction(self)
    }
}

/// How many times [`retry_transaction`] runs a transaction in all.
const TRANSACTION_TRIES: u32 = 8;

/// Runs `transaction` (begin, work, commit) and runs it again, with jittered back-off, while it
/// fails with an error that [restarts the transaction](RestartsTransaction), up to 8 times in all.
/// InnoDB picks a deadlock victim among concurrent inserts of one key and rolls its whole
/// transaction back; Postgres does the same for a serialization failure: the transaction, not one
/// statement, must run again.
///
/// ```no_run
/// # use idem_runtime as idem;
/// # async fn demo(store: &idem_runtime::SqliteStore) -> Result<(), idem_runtime::IdemError> {
/// let n = idem::retry_transaction(|| async {
///     let mut tx = store.begin().await?;
///     // … tx-mode calls and your own writes …
///     tx.commit().await?;
///     Ok::<_, idem::IdemError>(1)
/// })
/// .await?;
/// # let _ = n; Ok(()) }
/// ```
///
/// # Errors
/// The transaction's last error.
pub async fn retry_transaction<T, E, F, Fut>(mut transaction: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: RestartsTransaction,
{
    let mut tried = 0;
    loop {
        match transaction().await {
            Err(e) if e.restarts_transaction() && tried + 1 < TRANSACTION_TRIES => {
                tried += 1;
                super::back_off(tried).await;
            }
            done => return done,
        }
    }
}
