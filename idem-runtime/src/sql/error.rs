//! Database errors sorted into idem's classes: transient (unavailable, busy) or permanent (schema,
//! other), with a message that says how to fix a missing table.

use std::fmt;

use super::dialect::Dialect;
use crate::backend::mysql_number;
use crate::{Busy, IdemError};

/// A database's refusal as idem reports it: the server, its code and its message. Not sqlx's own
/// error, whose `Display` of a Postgres error ends with the line of the server's C source that
/// raised it (`… does not exist at line 1392`, which reads as a line of the user's SQL) and whose
/// `Debug` names that file.
#[derive(Debug)]
pub(crate) struct ServerError {
    /// `SQLite`, `MySQL`, `Postgres`.
    server: &'static str,
    /// The server's code: SQLite's extended result code, MySQL's error number and SQLSTATE,
    /// Postgres's SQLSTATE.
    code: Option<String>,
    message: String,
}

impl ServerError {
    fn of(db: &dyn sqlx::error::DatabaseError, dialect: Dialect) -> Self {
        let (server, code) = match (dialect, mysql_number(db)) {
            (Dialect::MySQL, Some(number)) => (
                "MySQL",
                Some(match db.code() {
                    Some(state) => format!("{number} ({state})"),
                    None => number.to_string(),
                }),
            ),
            (Dialect::MySQL, None) => ("MySQL", db.code().map(|c| c.into_owned())),
            (Dialect::SQLite, _) => ("SQLite", db.code().map(|c| c.into_owned())),
            (Dialect::Postgres, _) => ("Postgres", db.code().map(|c| c.into_owned())),
        };
        ServerError {
            server,
            code,
            message: db.message().to_owned(),
        }
    }
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.code() {
            Some(code) => write!(f, "{} error {code}: {}", self.server, self.message),
            None => write!(f, "{} error: {}", self.server, self.message),
        }
    }
}

impl std::error::Error for ServerError {}

impl ServerError {
    /// A refusal of `server` with `code`, as a test builds one without a server.
    #[cfg(test)]
    pub(crate) fn new(server: &'static str, code: &str, message: &str) -> Self {
        ServerError {
            server,
            code: Some(code.to_owned()),
            message: message.to_owned(),
        }
    }

    /// The server's code (a backend reads its own refusals by it: Postgres's SQLSTATE).
    pub(crate) fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }
}

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
            let server = ServerError::of(&*db, dialect);
            match class {
                Class::Unavailable => IdemError::unavailable(server),
                Class::Busy(reason) => IdemError::busy(reason, server),
                Class::MissingSchema => IdemError::StoreSchema {
                    hint:
                        "a table or column idem needs is missing; run the store's `migrate()` at \
                           start-up (or apply the store's `MIGRATIONS`, which `idem migrate \
                           --print <url>` prints with your table names)"
                            .to_owned(),
                    source: Box::new(server),
                },
                Class::Other => IdemError::store(server),
            }
        }
        sqlx::Error::Protocol(what) => IdemError::store(format!(
            "the {} server's answer was not what its protocol says: {}",
            dialect.server(),
            without_location(&what)
        )),
        other => IdemError::store(other),
    }
}

/// A protocol error's text without the place in sqlx's source it was raised at, which sqlx appends
/// (`unexpected message: CopyData (sqlx_postgres::connection::establish:130)`): a line of the
/// driver, not something the user can act on.
pub(crate) fn without_location(text: &str) -> &str {
    let located = text
        .strip_suffix(')')
        .and_then(|body| body.rsplit_once(" ("))
        .filter(|(_, place)| {
            place.rsplit_once(':').is_some_and(|(module, line)| {
                module.starts_with("sqlx")
                    && !line.is_empty()
                    && line.bytes().all(|b| b.is_ascii_digit())
            })
        });
    match located {
        Some((head, _)) => head,
        None => text,
    }
}

/// Sorts a MySQL / MariaDB error by its number.
///
/// A statement cut off before it finished (a lock wait or a statement time limit ran out, or an
/// operator killed the query) changed nothing and holds no lock: `LockTimeout`, which a claim
/// answers as "in progress" (a claimant's transaction is what idem's one-row statements wait for)
/// and idem retries elsewhere. A server that cannot give this client a session or lost it is
/// `Unavailable`: nothing was written, and another connection, later, can succeed.
fn classify_mysql(number: u16, message: &str) -> Class {
    match number {
        1213 => Class::Busy(Busy::Deadlock),
        // 1205: lock wait timeout; 3572: NOWAIT found a lock; 1969: MariaDB's max_statement_time;
        // 3024: MySQL's max_execution_time; 1317: the query was killed (`KILL QUERY`).
        1205 | 3572 | 1969 | 3024 | 1317 => Class::Busy(Busy::LockTimeout),
        // 1146: no such table; 1054: unknown column.
        1146 | 1054 => Class::MissingSchema,
        // 1040: too many connections; 1203 / 1226: the user's connection (or query) limit;
        // 1053: shutdown in progress; 1927: the connection was killed (MariaDB); 4031: dropped
        // for inactivity (MySQL); 2006 / 2013: server gone / connection lost (the C client's
        // numbers, which proxies pass on; sqlx itself reports a lost connection as an I/O error).
        1040 | 1203 | 1226 | 1053 | 1927 | 4031 | 2006 | 2013 => Class::Unavailable,
        // A Galera node out of the cluster's primary component (a member just died or joined),
        // or one still joining: 1047 (`WSREP has not yet prepared node for application use`) and
        // 1180 at commit (`… Not connected to Primary Component`). The write set was not
        // replicated, so nothing was written; another node, or this one a moment later, answers.
        1047 | 1180 if wsrep_not_ready(message) => Class::Unavailable,
        _ => classify(Dialect::MySQL, None, message),
    }
}

/// Whether a MariaDB message says its Galera node cannot take writes now.
fn wsrep_not_ready(message: &str) -> bool {
    message.contains("WSREP") || message.contains("Primary Component")
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
            // 55P03: lock_timeout (or NOWAIT). 57014: the statement was cancelled, by
            // statement_timeout (often a role's or database's, shorter than the store's lock
            // timeout) or by pg_cancel_backend: idem's statements touch one row by its key, so
            // what runs that long is a wait for a claimant's row lock. Either way the statement
            // changed nothing: the same class, so a claim cut off this way is "in progress" too.
            "55P03" | "57014" => Class::Busy(Busy::LockTimeout),
            "42P01" | "42703" | "42S02" | "42S22" => Class::MissingSchema,
            // 08: connection exceptions. 53: insufficient resources (too many connections, disk
            // full, out of memory): the server cannot serve now, a retry later can succeed.
            // 57P01 / 57P02 / 57P03: administrator shutdown or termination, crash, starting up;
            // 57P05 and 25P03: the server closed an idle session / an idle transaction (with
            // the transaction: run it again).
            c if c.starts_with("08") || c.starts_with("53") => Class::Unavailable,
            "57P01" | "57P02" | "57P03" | "57P05" | "25P03" => Class::Unavailable,
            _ if message.contains("Lock wait timeout exceeded") => Class::Busy(Busy::LockTimeout),
            _ => Class::Other,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_reads_as_the_server_and_its_code() {
        let refusal = ServerError::new("Postgres", "25006", "read-only transaction");
        assert_eq!(refusal.code(), Some("25006"));
        assert_eq!(
            refusal.to_string(),
            "Postgres error 25006: read-only transaction"
        );
    }

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
        assert_eq!(pg("57014"), Class::Busy(Busy::LockTimeout));
        assert_eq!(pg("42P01"), Class::MissingSchema);
        assert_eq!(pg("42703"), Class::MissingSchema);
        for unavailable in [
            "08000", "08001", "08003", "08004", "08006", "08P01", "53000", "53100", "53200",
            "53300", "53400", "57P01", "57P02", "57P03", "57P05", "25P03",
        ] {
            assert_eq!(pg(unavailable), Class::Unavailable, "{unavailable}");
        }
        // Permanent: constraints, bad data, a read-only transaction, a dropped database,
        // insufficient privilege.
        for other in [
            "23505", "23502", "22001", "25006", "57P04", "42501", "XX000",
        ] {
            assert_eq!(pg(other), Class::Other, "{other}");
        }
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

    #[test]
    fn protocol_errors_lose_the_driver_s_source_location() {
        assert_eq!(
            without_location(
                "establish: unexpected message: CopyData (sqlx_postgres::connection::establish:130)"
            ),
            "establish: unexpected message: CopyData"
        );
        for kept in [
            "no location",
            "a note (in parentheses)",
            "(sqlx_postgres::x:)",
            "ends (my::module:12)",
        ] {
            assert_eq!(without_location(kept), kept);
        }
        let e = store_error(
            sqlx::Error::Protocol("unexpected message: 'Z' (sqlx_postgres::io:7)".to_owned()),
            Dialect::Postgres,
        );
        assert!(matches!(e, IdemError::Store { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "the idempotency store failed: the Postgres server's answer was not what its protocol \
             says: unexpected message: 'Z'"
        );
    }

    #[test]
    fn sorts_mysql_numbers() {
        let my = |number: u16| classify_mysql(number, "");
        assert_eq!(my(1213), Class::Busy(Busy::Deadlock));
        for timeout in [1205, 3572, 1969, 3024, 1317] {
            assert_eq!(my(timeout), Class::Busy(Busy::LockTimeout), "{timeout}");
        }
        assert_eq!(my(1146), Class::MissingSchema);
        assert_eq!(my(1054), Class::MissingSchema);
        for unavailable in [1040, 1203, 1226, 1053, 1927, 4031, 2006, 2013] {
            assert_eq!(my(unavailable), Class::Unavailable, "{unavailable}");
        }
        // Permanent: a duplicate key, a value too long, a missing privilege, a syntax error.
        for other in [1062, 1406, 1142, 1064] {
            assert_eq!(my(other), Class::Other, "{other}");
        }
        // A Galera node out of the primary component, or still joining (the texts MariaDB sends).
        for (number, message) in [
            (1047, "WSREP has not yet prepared node for application use"),
            (
                1180,
                "Error while appending streaming replication fragment(provider status: Not \
                 connected to Primary Component)",
            ),
        ] {
            assert_eq!(
                classify_mysql(number, message),
                Class::Unavailable,
                "{message}"
            );
        }
        assert_eq!(my(1047), Class::Other, "another 1047 is not Galera's");
    }
}
