//! Connections that can carry a transactional idempotent call (`tx = "…"`).

use async_trait::async_trait;

use crate::IdemError;
use crate::store::{ClaimOutcome, ClaimRequest, Store};

/// A database connection inside a transaction, on which idem can claim and mark a record so that
/// the claim, the business writes and the mark commit or roll back together.
///
/// Implemented for `sqlx::Transaction<'_, Sqlite>` and `SqliteConnection` (feature `sqlite`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a transaction idem can join",
    label = "`tx` must name a `&mut sqlx::Transaction<'_, DB>` (or `&mut DB::Connection`) of a store's database",
    note = "enable the cargo feature of that database on `idem` and begin the transaction with `pool.begin()`"
)]
#[async_trait]
pub trait TxConnection: Send {
    /// Opens a savepoint and claims the record in it. On any outcome but `Acquired` nothing stays
    /// written and the savepoint is released.
    ///
    /// # Errors
    /// [`IdemError::TxStoreMismatch`] when `store` is of another backend; backend errors.
    async fn idem_claim(
        &mut self,
        store: &dyn Store,
        req: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, IdemError>;

    /// Marks the claimed record SUCCEEDED with `snapshot` and releases the savepoint.
    ///
    /// # Errors
    /// [`IdemError::LeaseLost`] if the record is no longer this attempt's; backend errors.
    async fn idem_complete(
        &mut self,
        store: &dyn Store,
        biz: &str,
        key: &str,
        attempt: u32,
        snapshot: &[u8],
    ) -> Result<(), IdemError>;

    /// Rolls back to the savepoint (the claim and every write since) and releases it.
    ///
    /// # Errors
    /// Backend errors.
    async fn idem_abort(&mut self) -> Result<(), IdemError>;
}
