//! The statements idem generates (a state transition's update and read) run on a connection
//! inside a transaction, in whatever dialect its backend speaks: the runtime hands it the
//! statement for its dialect and the values to bind (`value.rs`). Every SQL store's transaction,
//! sqlx's transactions and connections, and the wrapping stores' transactions offer it.

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
/// Implemented by each SQL backend for its store's transaction and for `idem::sqlx`'s transaction
/// and connection of its database: `idem::SqliteTx` (from `SqliteStore::begin`),
/// `idem::sqlx::Transaction<'_, Sqlite>` and `SqliteConnection` (feature `sqlite`); `idem::MySqlTx`
/// (from `MySqlStore::begin`), `Transaction<'_, MySql>` and `MySqlConnection` (feature `mysql`);
/// `idem::PgTx` (from `PgStore::begin`), `Transaction<'_, Postgres>` and `PgConnection` (feature
/// `postgres`); and the wrapping stores' `ShardedTx` and `EncryptedTx` over one of those.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a transaction a state transition can run in",
    label = "`tx` must name a `&mut` transaction on the machine's database",
    note = "pass the transaction from the store's `begin()` (`idem::SqliteTx`, `idem::MySqlTx` or `idem::PgTx`), or a `Transaction` / connection of `idem::sqlx`, the sqlx (0.9) idem is built with; a `sqlx::Transaction` from another sqlx version is another type: depend on the same sqlx version as idem, or name `idem::sqlx` in your code"
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

/// `TransitionConn` for one sqlx driver's connection and for its `Transaction` (which runs on that
/// connection). Called once by each server backend's `transition.rs`, with its own `query` (how
/// values are bound), `int_at` (how an integer column is read) and `db_error` (how errors are
/// classified) in scope; `attrs` go on both impls. SQLite writes its impls out: they are the ones
/// rustc lists in the "not a transaction" error, and a listed impl should show the user code, not
/// this macro.
#[cfg(any(feature = "mysql", feature = "postgres"))]
macro_rules! sqlx_transition_conn {
    ($conn:ty, $db:ty, $dialect:expr $(, #[$attr:meta])*) => {
        $(#[$attr])*
        #[async_trait::async_trait]
        impl $crate::sql::conn::TransitionConn for $conn {
            fn dialect(&self) -> $crate::sql::dialect::Dialect {
                $dialect
            }

            async fn execute(
                &mut self,
                sql: &'static str,
                args: &[$crate::sql::value::SqlValue<'_>],
            ) -> Result<u64, $crate::IdemError> {
                let done = query(sql, args).execute(self).await.map_err(db_error)?;
                Ok(done.rows_affected())
            }

            async fn execute_unprepared(&mut self, sql: &str) -> Result<(), $crate::IdemError> {
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
                    .execute(self)
                    .await
                    .map_err(db_error)?;
                Ok(())
            }

            async fn read_state(
                &mut self,
                sql: &'static str,
                args: &[$crate::sql::value::SqlValue<'_>],
                versioned: bool,
            ) -> Result<Option<$crate::sql::conn::StateRow>, $crate::IdemError> {
                use sqlx::Row as _;
                let Some(row) = query(sql, args)
                    .fetch_optional(self)
                    .await
                    .map_err(db_error)?
                else {
                    return Ok(None);
                };
                Ok(Some($crate::sql::conn::StateRow {
                    status: row.try_get(0).map_err(db_error)?,
                    already: int_at(&row, 1)? == 1,
                    version: if versioned { Some(int_at(&row, 2)?) } else { None },
                }))
            }
        }

        $(#[$attr])*
        #[async_trait::async_trait]
        impl $crate::sql::conn::TransitionConn for sqlx::Transaction<'_, $db> {
            fn dialect(&self) -> $crate::sql::dialect::Dialect {
                $dialect
            }

            async fn execute(
                &mut self,
                sql: &'static str,
                args: &[$crate::sql::value::SqlValue<'_>],
            ) -> Result<u64, $crate::IdemError> {
                $crate::sql::conn::TransitionConn::execute(&mut **self, sql, args).await
            }

            async fn execute_unprepared(&mut self, sql: &str) -> Result<(), $crate::IdemError> {
                $crate::sql::conn::TransitionConn::execute_unprepared(&mut **self, sql).await
            }

            async fn read_state(
                &mut self,
                sql: &'static str,
                args: &[$crate::sql::value::SqlValue<'_>],
                versioned: bool,
            ) -> Result<Option<$crate::sql::conn::StateRow>, $crate::IdemError> {
                $crate::sql::conn::TransitionConn::read_state(&mut **self, sql, args, versioned)
                    .await
            }
        }
    };
}
#[cfg(any(feature = "mysql", feature = "postgres"))]
pub(crate) use sqlx_transition_conn;

/// `Deref`, `conn()`, `TransitionConn` and `StoreTx` for a transaction that wraps a store's
/// transaction in its field `tx` (`ShardedTx<S>`, `EncryptedTx<S>`): every call goes to the inner
/// transaction, so your queries (on `conn()`) and `#[state_transition]` work on the wrapper as on
/// the store's own transaction. `attrs` go on the `TransitionConn` and `StoreTx` impls.
macro_rules! wrapping_transition_tx {
    ($wrapper:ident $(, #[$attr:meta])*) => {
        /// Derefs to the inner transaction's connection, to read it.
        impl<S: $crate::TransactionalStore> std::ops::Deref for $wrapper<S>
        where
            S::Tx: std::ops::Deref,
        {
            type Target = <S::Tx as std::ops::Deref>::Target;

            fn deref(&self) -> &Self::Target {
                &self.tx
            }
        }

        impl<S: $crate::TransactionalStore> $wrapper<S> {
            /// The inner transaction's connection, for your own queries in it:
            /// `query.execute(tx.conn())`.
            ///
            /// Given by this method rather than by `DerefMut`: a `DerefMut` to a type only known
            /// through `S` would make every blanket impl over `DerefMut` in the build (redis's
            /// `ConnectionLike`, and with it every Redis command) a candidate for its methods.
            pub fn conn(&mut self) -> &mut <S::Tx as std::ops::Deref>::Target
            where
                S::Tx: std::ops::DerefMut,
            {
                &mut self.tx
            }
        }

        $(#[$attr])*
        #[async_trait::async_trait]
        impl<S: $crate::TransactionalStore> $crate::sql::conn::TransitionConn for $wrapper<S>
        where
            S::Tx: $crate::sql::conn::TransitionConn,
        {
            fn dialect(&self) -> $crate::sql::dialect::Dialect {
                self.tx.dialect()
            }

            async fn execute(
                &mut self,
                sql: &'static str,
                args: &[$crate::sql::value::SqlValue<'_>],
            ) -> Result<u64, $crate::IdemError> {
                self.tx.execute(sql, args).await
            }

            async fn execute_unprepared(&mut self, sql: &str) -> Result<(), $crate::IdemError> {
                self.tx.execute_unprepared(sql).await
            }

            async fn read_state(
                &mut self,
                sql: &'static str,
                args: &[$crate::sql::value::SqlValue<'_>],
                versioned: bool,
            ) -> Result<Option<$crate::sql::conn::StateRow>, $crate::IdemError> {
                self.tx.read_state(sql, args, versioned).await
            }
        }

        /// Commits or rolls back the inner transaction, so code written against
        /// [`StoreTx`](crate::store::StoreTx) (a transaction it began and ends itself) works on the
        /// wrapper too.
        $(#[$attr])*
        #[async_trait::async_trait]
        impl<S: $crate::TransactionalStore> $crate::StoreTx for $wrapper<S>
        where
            S::Tx: $crate::StoreTx,
        {
            async fn commit(self: Box<Self>) -> Result<(), $crate::IdemError> {
                Box::new(self.tx).commit().await
            }

            async fn rollback(self: Box<Self>) -> Result<(), $crate::IdemError> {
                Box::new(self.tx).rollback().await
            }
        }
    };
}
pub(crate) use wrapping_transition_tx;
