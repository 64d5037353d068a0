//! What the record layer needs of each database beyond its statements ([`RecordDb`]), and the
//! value helpers its backends share.

use sqlx::{ColumnIndex, Database, Decode, Row, Type};

use crate::IdemError;
use crate::sql::dialect::Dialect;

/// `bytes` as upper-case hexadecimal digits (what SQLite's `unhex` and MySQL's `X'…'` read).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn hex_digits(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02X}");
    }
    out
}

/// What the record layer needs of a database beyond its statements.
pub trait RecordDb: Database {
    /// The dialect, whose error classes [`RecordDb::error`] applies.
    const DIALECT: Dialect;

    /// What a statement binds at [`Param::Clock`](super::Param::Clock), given the store's clock offset (what it is
    /// depends on the statements: an offset the database adds to its own clock, or the time).
    fn clock(offset: i64) -> i64;

    /// The `attempt` column.
    fn attempt(row: &Self::Row) -> Result<u32, IdemError>;

    /// The `fence` column.
    fn fence(row: &Self::Row) -> Result<u64, IdemError>;

    /// How many rows a statement changed (or, with MySQL's `CLIENT_FOUND_ROWS`, matched).
    fn rows_affected(done: &Self::QueryResult) -> u64;

    /// A text column (`idem_key`, `biz_type`) as a string.
    fn text(row: &Self::Row, column: &str) -> Result<String, IdemError>
    where
        for<'r> String: Decode<'r, Self> + Type<Self>,
        for<'n> &'n str: ColumnIndex<Self::Row>,
    {
        row.try_get(column).map_err(Self::error)
    }

    /// Whether the database's text columns can hold `text` (Postgres's cannot hold NUL: no claim
    /// stored such a key, so there is no record to read).
    fn holds(text: &str) -> bool {
        let _ = text;
        true
    }

    /// The store's error for a driver error.
    fn error(e: sqlx::Error) -> IdemError {
        crate::sql::error::store_error(e, Self::DIALECT)
    }
}

/// An integer column read as `T` (attempt, fence), which it must fit.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn in_range<T: TryFrom<i64>>(value: i64, column: &str) -> Result<T, IdemError> {
    T::try_from(value).map_err(|_| IdemError::store(format!("{column} {value} out of range")))
}
