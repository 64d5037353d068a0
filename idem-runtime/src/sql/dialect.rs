//! The SQL dialects idem writes: placeholders, the database clock, identifier quoting, locking
//! reads and savepoints. Everything here is text; each backend runs it on its own driver.

#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
use crate::store::order::ClaimOrder;

/// A SQL dialect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// SQLite: `?` placeholders, `"ident"`; a `BEGIN IMMEDIATE` transaction already holds the write
    /// lock, so reads need no `FOR UPDATE`.
    SQLite,
    /// MySQL / MariaDB: `?` placeholders, `` `ident` ``, `SELECT … FOR UPDATE`.
    MySQL,
    /// PostgreSQL: `$1`, `$2`, … placeholders, `"ident"`, `SELECT … FOR UPDATE`.
    Postgres,
}

impl Dialect {
    /// The server this dialect speaks to, for messages.
    pub const fn server(self) -> &'static str {
        match self {
            Dialect::SQLite => "SQLite",
            Dialect::MySQL => "MySQL",
            Dialect::Postgres => "Postgres",
        }
    }

    /// The character that opens and closes a quoted identifier.
    pub const fn quote(self) -> u8 {
        match self {
            Dialect::SQLite | Dialect::Postgres => b'"',
            Dialect::MySQL => b'`',
        }
    }

    /// `name` quoted as an identifier (a quote inside is doubled); `schema.table` quotes each part.
    pub fn quote_ident(self, name: &str) -> String {
        let q = self.quote() as char;
        name.split('.')
            .map(|part| {
                let doubled = part.replace(q, &format!("{q}{q}"));
                format!("{q}{doubled}{q}")
            })
            .collect::<Vec<_>>()
            .join(".")
    }

    /// What a read that must see (and lock) the current row version appends: REPEATABLE READ
    /// snapshots in MySQL and Postgres would otherwise show a row as it was when the transaction
    /// began.
    pub const fn locking_read(self) -> &'static str {
        match self {
            Dialect::SQLite => "",
            Dialect::MySQL | Dialect::Postgres => " FOR UPDATE",
        }
    }

    /// The database clock in milliseconds since the Unix epoch.
    pub const fn now_ms(self) -> &'static str {
        match self {
            Dialect::SQLite => "CAST(unixepoch('subsec') * 1000 AS INTEGER)",
            Dialect::MySQL => "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)",
            Dialect::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
        }
    }

    /// What `now = "col"` writes: the database's current time (SQLite: UTC text
    /// `YYYY-MM-DD HH:MM:SS`; MySQL: the session time zone's `DATETIME`/`TIMESTAMP`; Postgres: a
    /// `timestamptz`, the transaction's start time).
    pub const fn current_timestamp(self) -> &'static str {
        "CURRENT_TIMESTAMP"
    }
}

/// A savepoint inside the caller's transaction: what `tx = "…"` claims and state transitions run in,
/// so their writes and the caller's commit or roll back together. The same text works in every
/// dialect.
///
/// Its name (`idem_claim_3`) is one no other `Savepoint` alive in this process has: MySQL replaces
/// a savepoint of the same name, so nested calls with one fixed name would release each other's.
/// A name goes back to be used again when its `Savepoint` is dropped (which idem does only once it
/// needs the savepoint no more), so a process uses about as many names as it has savepoints open at
/// once: `pg_stat_statements` (and MySQL's statement digests) keep one entry per name, and a new
/// name per call would fill them and keep evicting.
#[derive(Debug)]
pub(crate) struct Savepoint {
    name: String,
    slot: u32,
}

/// Names given back by dropped savepoints, for the next ones.
static FREE_SLOTS: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

impl Savepoint {
    /// A savepoint for one call; `purpose` starts its name (`idem_claim`, `idem_transition`).
    pub(crate) fn new(purpose: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        let free = FREE_SLOTS.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let slot = free.unwrap_or_else(|| NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        Savepoint {
            name: format!("{purpose}_{slot}"),
            slot,
        }
    }

    /// The savepoint of a transactional `#[idempotent]` claim.
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "mysql", feature = "postgres")),
        allow(dead_code)
    )]
    pub(crate) fn claim() -> Self {
        Self::new("idem_claim")
    }

    /// The savepoint a transaction's first claim takes, opened in the round trip of its `BEGIN`,
    /// and the text that opens it, to send right after the `BEGIN` (`"; SAVEPOINT …"`): one
    /// while the store's claims mostly create records (`store/order.rs`); none (and no text)
    /// while they mostly meet one, when a claim reads first and a replay needs no savepoint.
    #[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
    pub(crate) fn with_begin(order: &ClaimOrder) -> (Option<Self>, String) {
        if order.read_first() {
            return (None, String::new());
        }
        let ready = Self::claim();
        let open = format!("; {}", ready.open());
        (Some(ready), open)
    }

    /// The savepoint of a `#[state_transition]` update and its body.
    pub(crate) fn transition() -> Self {
        Self::new("idem_transition")
    }

    pub(crate) fn open(&self) -> String {
        format!("SAVEPOINT {}", self.name)
    }

    /// Opens this savepoint after releasing `done`, the savepoint of a claim marked done since
    /// (one batch, one round trip): a call that completes leaves its savepoint for the next claim
    /// in the transaction to release, or for the commit, instead of spending a round trip on it.
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "mysql", feature = "postgres")),
        allow(dead_code)
    )]
    pub(crate) fn open_after(&self, done: Option<Savepoint>) -> String {
        match done {
            Some(done) => format!("{}; {}", done.release(), self.open()),
            None => self.open(),
        }
    }

    /// Keeps what was written since it opened (the enclosing transaction decides the rest).
    pub(crate) fn release(&self) -> String {
        format!("RELEASE SAVEPOINT {}", self.name)
    }

    /// Undoes everything written since it opened (release it after).
    pub(crate) fn rollback(&self) -> String {
        format!("ROLLBACK TO SAVEPOINT {}", self.name)
    }
}

impl Drop for Savepoint {
    fn drop(&mut self) {
        FREE_SLOTS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_identifiers_per_dialect() {
        assert_eq!(Dialect::SQLite.quote_ident("order"), "\"order\"");
        assert_eq!(Dialect::MySQL.quote_ident("key"), "`key`");
        assert_eq!(
            Dialect::Postgres.quote_ident("shop.order"),
            "\"shop\".\"order\""
        );
        assert_eq!(Dialect::MySQL.quote_ident("a`b"), "`a``b`");
    }

    #[test]
    fn every_call_gets_its_own_savepoint() {
        let (a, b) = (Savepoint::claim(), Savepoint::claim());
        assert_ne!(a.open(), b.open());
        assert!(a.open().starts_with("SAVEPOINT idem_claim_"));
        assert_eq!(a.rollback().replace("ROLLBACK TO ", ""), a.open());
    }

    #[test]
    fn names_are_distinct_while_alive_and_used_again_once_dropped() {
        let alive: Vec<Savepoint> = (0..64).map(|_| Savepoint::claim()).collect();
        let names: std::collections::HashSet<String> = alive.iter().map(Savepoint::open).collect();
        assert_eq!(names.len(), 64, "no two live savepoints share a name");
        drop(alive);
        // Calls one after another (other tests may take names meanwhile) reuse dropped names
        // instead of making a new one each time.
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            seen.insert(Savepoint::claim().open());
        }
        assert!(
            seen.len() < 100,
            "{} names for 1,000 calls in turn",
            seen.len()
        );
    }
}
