//! Where a transition runs: a connection inside a transaction, in whatever dialect its backend
//! speaks. The runtime hands it the statement for its dialect and the values to bind.

use async_trait::async_trait;

use super::value::SqlValue;
use crate::IdemError;
use crate::sql::dialect::Dialect;

/// The row read after an update that moved nothing: its state, whether it is already the target
/// with matching `match` columns, and its version when the machine has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRow {
    /// The stored state name.
    pub status: String,
    /// The row is in the target state with equal `match` columns.
    pub already: bool,
    /// The version column, when the machine has one.
    pub version: Option<i64>,
}

/// A connection inside a transaction on which a `#[state_transition]` runs.
///
/// Implemented (feature `sqlite`) for `idem::SqliteTx` (from `SqliteStore::begin`),
/// `idem::sqlx::Transaction<'_, Sqlite>` and `SqliteConnection`; each backend adds its own.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a transaction a state transition can run in",
    label = "`tx` must name a `&mut` transaction on the machine's database",
    note = "pass the transaction from the store's `begin()` (e.g. `idem::SqliteTx`), or a `Transaction` / connection of `idem::sqlx`, the sqlx (0.9) idem is built with; a `sqlx::Transaction` from another sqlx version is another type: depend on the same sqlx version as idem, or name `idem::sqlx` in your code"
)]
#[async_trait]
pub trait TransitionConn: Send {
    /// The dialect of the database.
    fn dialect(&self) -> Dialect;

    /// Runs `sql` with `args` bound in order; the number of rows it changed.
    ///
    /// # Errors
    /// The database's error, classified.
    async fn execute(&mut self, sql: &'static str, args: &[SqlValue<'_>])
    -> Result<u64, IdemError>;

    /// Runs a statement without parameters and without preparing it (savepoints, whose names
    /// differ per call).
    ///
    /// # Errors
    /// The database's error, classified.
    async fn execute_unprepared(&mut self, sql: &str) -> Result<(), IdemError>;

    /// Runs a transition's read statement: the row's state, the "already applied" flag, and the
    /// version when `versioned` (the machine has a version column).
    ///
    /// # Errors
    /// The database's error, classified.
    async fn read_state(
        &mut self,
        sql: &'static str,
        args: &[SqlValue<'_>],
        versioned: bool,
    ) -> Result<Option<StateRow>, IdemError>;
}

/// A transaction a transition began on its own (`#[state_transition(store = "…")]`): it commits
/// when the fn succeeds and rolls back otherwise.
#[async_trait]
pub trait TransitionTx: TransitionConn {
    /// Commits.
    ///
    /// # Errors
    /// The database's error, classified.
    async fn commit(self: Box<Self>) -> Result<(), IdemError>;

    /// Rolls back.
    ///
    /// # Errors
    /// The database's error, classified.
    async fn rollback(self: Box<Self>) -> Result<(), IdemError>;
}
