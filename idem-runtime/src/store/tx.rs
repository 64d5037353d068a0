//! A store's transaction, plain: it ends with a commit or a rollback.
//!
//! What runs inside it is the business of the traits that extend it or sit beside it:
//! `IdemTx` (`tx = "…"` claims and marks), `TransitionConn` (the statements idem generates, in
//! `sql/conn.rs`; [`TransitionTx`] is the two together), and the connection each store's
//! transaction derefs to for your own queries. The HTTP layer's transaction mode ends its
//! transaction through [`StoreTx`] alone.

use async_trait::async_trait;

use crate::IdemError;
use crate::sql::conn::TransitionConn;

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

/// A store's transaction that runs the statements idem generates: what
/// `#[state_transition(store = "…")]` begins on its own ([`Store::begin_transition`]), commits when
/// the fn succeeds and rolls back otherwise. Every type that is a [`StoreTx`] and a
/// [`TransitionConn`] is one.
///
/// [`Store::begin_transition`]: crate::Store::begin_transition
pub trait TransitionTx: TransitionConn + StoreTx {}

impl<T: TransitionConn + StoreTx + ?Sized> TransitionTx for T {}
