//! Database errors sorted into idem's classes: transient (unavailable, busy) or permanent (schema,
//! other), with a message that says how to fix a missing table.

use super::dialect::Dialect;
use crate::{Busy, IdemError};

/// A driver error as an [`IdemError`] of the right class.
pub(crate) fn store_error(e: sqlx::Error, dialect: Dialect) -> IdemError {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => IdemError::unavailable(e),
        sqlx::Error::Database(db) => {
            let class = match mysql_number(&*db) {
                Some(number) => classify_mysql(number, db.message()),
                None => classify(dialect, db.code().as_deref(), db.message()),
            };
            match class {
                Class::Unavailable => IdemError::unavailable(sqlx::Error::Database(db)),
                Class::Busy(reason) => IdemError::busy(reason, sqlx::Error::Database(db)),
                Class::MissingSchema => IdemError::StoreSchema {
                    hint:
                        "a table or column idem needs is missing; run the store's `migrate()` at \
                           start-up (or apply the DDL shipped in idem-runtime/migrations)"
                            .to_owned(),
                    source: Box::new(sqlx::Error::Database(db)),
                },
                Class::Other => IdemError::store(sqlx::Error::Database(db)),
            }
        }
        other => IdemError::store(other),
    }
}

/// The server's error number, for MySQL and MariaDB (their SQLSTATE is too coarse: a lock wait
/// timeout is `HY000`).
#[cfg(feature = "mysql")]
fn mysql_number(db: &dyn sqlx::error::DatabaseError) -> Option<u16> {
    db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(|e| e.number())
}

#[cfg(not(feature = "mysql"))]
fn mysql_number(_: &dyn sqlx::error::DatabaseError) -> Option<u16> {
    None
}

/// Sorts a MySQL / MariaDB error by its number.
fn classify_mysql(number: u16, message: &str) -> Class {
    match number {
        1213 => Class::Busy(Busy::Deadlock),
        // 1205: lock wait timeout; 3572: NOWAIT found a lock; 1969: MariaDB's max_statement_time.
        1205 | 3572 | 1969 => Class::Busy(Busy::LockTimeout),
        // 1146: no such table; 1054: unknown column.
        1146 | 1054 => Class::MissingSchema,
        // 1040 too many connections, 1053 shutdown in progress, 2006/2013 server gone / lost.
        1040 | 1053 | 2006 | 2013 => Class::Unavailable,
        _ => classify(Dialect::MySQL, None, message),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Class {
    Unavailable,
    Busy(Busy),
    MissingSchema,
    Other,
}

/// Sorts a database error by its code (SQLite: the extended result code; MySQL and Postgres: the
/// SQLSTATE) and, where the code is too coarse, its message.
fn classify(dialect: Dialect, code: Option<&str>, message: &str) -> Class {
    match dialect {
        Dialect::SQLite => {
            let primary = code.and_then(|c| c.parse::<i32>().ok()).map(|c| c & 0xff);
            match primary {
                // SQLITE_BUSY, SQLITE_LOCKED
                Some(5 | 6) => Class::Busy(Busy::Locked),
                // SQLITE_IOERR, SQLITE_CANTOPEN, SQLITE_NOTADB
                Some(10 | 14 | 26) => Class::Unavailable,
                // SQLITE_ERROR: a missing table or column is named in the message.
                Some(1)
                    if message.starts_with("no such table")
                        || message.starts_with("no such column")
                        || message.contains("has no column named") =>
                {
                    Class::MissingSchema
                }
                _ => Class::Other,
            }
        }
        Dialect::MySQL | Dialect::Postgres => match code.unwrap_or_default() {
            "40P01" => Class::Busy(Busy::Deadlock),
            // MySQL reports its deadlock (1213) under 40001 as well.
            "40001" if dialect == Dialect::MySQL => Class::Busy(Busy::Deadlock),
            "40001" => Class::Busy(Busy::Serialization),
            "55P03" => Class::Busy(Busy::LockTimeout),
            "42P01" | "42703" | "42S02" | "42S22" => Class::MissingSchema,
            c if c.starts_with("08") || c == "57P01" || c == "57P03" => Class::Unavailable,
            _ if message.contains("Lock wait timeout exceeded") => Class::Busy(Busy::LockTimeout),
            _ => Class::Other,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_sqlite_codes() {
        let sqlite = |code: &str, msg: &str| classify(Dialect::SQLite, Some(code), msg);
        assert_eq!(sqlite("5", "database is locked"), Class::Busy(Busy::Locked));
        assert_eq!(
            sqlite("517", "database is locked"),
            Class::Busy(Busy::Locked)
        );
        assert_eq!(
            sqlite("262", "database table is locked"),
            Class::Busy(Busy::Locked)
        );
        assert_eq!(
            sqlite("1", "no such table: idem_record"),
            Class::MissingSchema
        );
        assert_eq!(sqlite("1", "no such column: fence"), Class::MissingSchema);
        assert_eq!(sqlite("1", "near \"x\": syntax error"), Class::Other);
        assert_eq!(sqlite("2067", "UNIQUE constraint failed"), Class::Other);
        assert_eq!(sqlite("10", "disk I/O error"), Class::Unavailable);
    }

    #[test]
    fn sorts_sqlstates() {
        let pg = |code: &str| classify(Dialect::Postgres, Some(code), "");
        assert_eq!(pg("40P01"), Class::Busy(Busy::Deadlock));
        assert_eq!(pg("40001"), Class::Busy(Busy::Serialization));
        assert_eq!(pg("55P03"), Class::Busy(Busy::LockTimeout));
        assert_eq!(pg("42P01"), Class::MissingSchema);
        assert_eq!(pg("08006"), Class::Unavailable);
        assert_eq!(pg("23505"), Class::Other);
        assert_eq!(
            classify(Dialect::MySQL, Some("40001"), ""),
            Class::Busy(Busy::Deadlock)
        );
        assert_eq!(
            classify(
                Dialect::MySQL,
                Some("HY000"),
                "Lock wait timeout exceeded; try restarting transaction"
            ),
            Class::Busy(Busy::LockTimeout)
        );
    }
}
