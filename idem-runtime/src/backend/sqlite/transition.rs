//! State transitions on SQLite: what `#[state_transition]` code calls (through `__private`).
//!
//! The generated fn opens a savepoint (in the caller's transaction, or in a `BEGIN IMMEDIATE`
//! transaction of a registered store), runs the conditional update, runs the body when one row moved,
//! and otherwise reads the row to tell a repeat from a refusal. SQLite's `BEGIN IMMEDIATE` already
//! holds the write lock, so the read needs no `FOR UPDATE`.

use sqlx::sqlite::SqliteRow;
use sqlx::{Row, Sqlite, SqliteConnection, Transaction};

use super::{Savepoint, SqliteStore, db_error};
use crate::transition::{StateMachine, Transition};
use crate::{IdemError, registry};

/// A connection a transition can run on: `sqlx::Transaction<'_, Sqlite>` or `SqliteConnection`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a transaction a state transition can run in",
    label = "`tx` must name a `&mut sqlx::Transaction<'_, Sqlite>` (or `&mut SqliteConnection`) parameter",
    note = "begin it with `store.begin()` (`BEGIN IMMEDIATE`) and commit it after the call"
)]
pub trait TransitionConn: Send {
    /// The connection.
    fn __idem_conn(&mut self) -> &mut SqliteConnection;
}

impl TransitionConn for SqliteConnection {
    fn __idem_conn(&mut self) -> &mut SqliteConnection {
        self
    }
}

impl TransitionConn for Transaction<'_, Sqlite> {
    fn __idem_conn(&mut self) -> &mut SqliteConnection {
        self
    }
}

/// The connection of a `tx = "…"` parameter.
pub fn transition_conn<C: TransitionConn + ?Sized>(conn: &mut C) -> &mut SqliteConnection {
    conn.__idem_conn()
}

/// Begins `BEGIN IMMEDIATE` on the SQLite store registered as `name` (`store = "name"`).
///
/// # Errors
/// [`IdemError::UnknownStore`], [`IdemError::TxStoreMismatch`] for a store of another backend, or
/// [`IdemError::StoreUnavailable`].
pub async fn transition_begin(name: &str) -> Result<Transaction<'static, Sqlite>, IdemError> {
    let store = registry::store(name)?;
    let Some(sqlite) = store.as_any().downcast_ref::<SqliteStore>() else {
        return Err(IdemError::TxStoreMismatch {
            store: name.to_owned(),
            backend: store.backend(),
            expected: "sqlite",
        });
    };
    sqlite.begin().await
}

/// Commits a transaction begun by [`transition_begin`].
///
/// # Errors
/// Backend errors.
pub async fn transition_commit(tx: Transaction<'static, Sqlite>) -> Result<(), IdemError> {
    tx.commit().await.map_err(db_error)
}

/// Rolls back a transaction begun by [`transition_begin`].
///
/// # Errors
/// Backend errors.
pub async fn transition_rollback(tx: Transaction<'static, Sqlite>) -> Result<(), IdemError> {
    tx.rollback().await.map_err(db_error)
}

/// A statement of the transition, to bind the values to.
pub fn transition_query(
    sql: &'static str,
) -> sqlx::query::Query<'static, Sqlite, <Sqlite as sqlx::Database>::Arguments> {
    sqlx::query(sql)
}

/// Opens the savepoint the update and the body run in.
///
/// # Errors
/// Backend errors.
pub async fn transition_savepoint(conn: &mut SqliteConnection) -> Result<(), IdemError> {
    Savepoint::TRANSITION.open(conn).await
}

/// Keeps the update and the body's writes (the enclosing transaction decides the rest).
///
/// # Errors
/// Backend errors.
pub async fn transition_release(conn: &mut SqliteConnection) -> Result<(), IdemError> {
    Savepoint::TRANSITION.release(conn).await
}

/// Undoes the update and the body's writes.
///
/// # Errors
/// Backend errors.
pub async fn transition_abort(conn: &mut SqliteConnection) -> Result<(), IdemError> {
    Savepoint::TRANSITION.abort(conn).await
}

/// A database error as an [`IdemError`] (`Store`, or `StoreUnavailable` when unreachable).
pub fn transition_db_error(e: sqlx::Error) -> IdemError {
    db_error(e)
}

/// Rows changed by the update, or the database's error as an [`IdemError`].
///
/// # Errors
/// [`IdemError::Store`] / [`IdemError::StoreUnavailable`].
pub fn transition_rows(
    done: Result<sqlx::sqlite::SqliteQueryResult, sqlx::Error>,
) -> Result<u64, IdemError> {
    done.map(|done| done.rows_affected()).map_err(db_error)
}

/// What a transition that changed no row means, from the row read after it (`None`: no such key).
///
/// # Errors
/// A stored status that is no state of `S`, or a database error.
pub fn transition_outcome<T, S: StateMachine>(
    row: Result<Option<SqliteRow>, sqlx::Error>,
    from: &[&str],
    expected_version: Option<i64>,
) -> Result<Transition<T, S>, IdemError> {
    let Some(row) = row.map_err(db_error)? else {
        return Ok(Transition::NotFound);
    };
    let status: String = row.try_get(0).map_err(db_error)?;
    let already: i64 = row.try_get(1).map_err(db_error)?;
    if already == 1 {
        return Ok(Transition::AlreadyApplied);
    }
    let current = S::parse(&status).ok_or_else(|| {
        IdemError::store(format!(
            "column `{}` of `{}` holds `{status}`, which is no state of `{}`",
            S::STATUS_COLUMN,
            S::TABLE,
            S::NAME
        ))
    })?;
    if let Some(expected) = expected_version
        && from.contains(&status.as_str())
    {
        let version: i64 = row.try_get(2).map_err(db_error)?;
        if version != expected {
            return Ok(Transition::VersionConflict { current, version });
        }
    }
    Ok(Transition::Rejected { current })
}

/// Defines sqlx `Type`/`Encode`/`Decode` for SQLite (TEXT, the stored state name) on a machine;
/// `#[derive(StateMachine)]` calls it, so the user's crate needs no sqlx features of its own.
#[doc(hidden)]
#[macro_export]
macro_rules! __idem_sqlite_text {
    ($machine:ty) => {
        impl $crate::sqlx::Type<$crate::sqlx::Sqlite> for $machine {
            fn type_info() -> <$crate::sqlx::Sqlite as $crate::sqlx::Database>::TypeInfo {
                <&str as $crate::sqlx::Type<$crate::sqlx::Sqlite>>::type_info()
            }
            fn compatible(ty: &<$crate::sqlx::Sqlite as $crate::sqlx::Database>::TypeInfo) -> bool {
                <&str as $crate::sqlx::Type<$crate::sqlx::Sqlite>>::compatible(ty)
            }
        }
        impl<'q> $crate::sqlx::Encode<'q, $crate::sqlx::Sqlite> for $machine {
            fn encode_by_ref(
                &self,
                buf: &mut <$crate::sqlx::Sqlite as $crate::sqlx::Database>::ArgumentBuffer,
            ) -> ::core::result::Result<
                $crate::sqlx::encode::IsNull,
                $crate::sqlx::error::BoxDynError,
            > {
                <&str as $crate::sqlx::Encode<'q, $crate::sqlx::Sqlite>>::encode(
                    $crate::StateMachine::as_str(*self),
                    buf,
                )
            }
        }
        impl<'r> $crate::sqlx::Decode<'r, $crate::sqlx::Sqlite> for $machine {
            fn decode(
                value: <$crate::sqlx::Sqlite as $crate::sqlx::Database>::ValueRef<'r>,
            ) -> ::core::result::Result<Self, $crate::sqlx::error::BoxDynError> {
                let name = <&str as $crate::sqlx::Decode<'r, $crate::sqlx::Sqlite>>::decode(value)?;
                <$machine as $crate::StateMachine>::parse(name).ok_or_else(|| {
                    ::std::format!(
                        "`{name}` is no state of `{}`",
                        <$machine as $crate::StateMachine>::NAME
                    )
                    .into()
                })
            }
        }
    };
}
