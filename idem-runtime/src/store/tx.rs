//! A store's transaction, plain: it ends with a commit or a rollback.
//!
//! What runs inside it is the business of the traits that extend it or sit beside it:
//! `IdemTx` (`tx = "…"` claims and marks), `TransitionConn` (the statements of
//! `#[state_transition]`; `TransitionTx` is the two together), and the connection each store's
//! transaction derefs to for your own queries. The HTTP layer's transaction mode ends its
//! transaction through this trait alone.

use async_trait::async_trait;

use crate::IdemError;

/// A transaction a store began (`SqliteStore::begin`, `MySqlStore::begin`, `PgStore::begin`, and
/// the wrapping stores' `ShardedTx` and `EncryptedTx`). Dropped without either call, it rolls
/// back.
#[async_trait]
pub trait StoreTx: Send {
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
