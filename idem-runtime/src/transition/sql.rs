//! The SQL text of a transition, built at compile time (`const fn`) from the machine's consts.

use std::fmt;

use super::StateMachine;
pub use crate::sql::dialect::Dialect;

/// Longest statement a transition can generate, in bytes.
const SQL_CAPACITY: usize = 1024;

/// A statement built at compile time (`const fn`) from the machine's table and columns.
#[derive(Clone, Copy)]
pub struct SqlText {
    buf: [u8; SQL_CAPACITY],
    len: usize,
    params: usize,
    dialect: Dialect,
}

impl SqlText {
    const fn new(dialect: Dialect) -> Self {
        SqlText {
            buf: [0; SQL_CAPACITY],
            len: 0,
            params: 0,
            dialect,
        }
    }

    const fn push(mut self, text: &str) -> Self {
        let bytes = text.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            assert!(
                self.len < SQL_CAPACITY,
                "idem: transition statement too long"
            );
            self.buf[self.len] = bytes[i];
            self.len += 1;
            i += 1;
        }
        self
    }

    /// An identifier, quoted for the dialect (`"order"`, `` `order` ``); `schema.table` quotes each
    /// part. A quote character inside a part is doubled.
    const fn ident(mut self, name: &str) -> Self {
        let q = self.dialect.quote();
        let bytes = name.as_bytes();
        self = self.byte(q);
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'.' {
                self = self.byte(q).byte(b'.').byte(q);
            } else {
                if bytes[i] == q {
                    self = self.byte(q);
                }
                self = self.byte(bytes[i]);
            }
            i += 1;
        }
        self.byte(q)
    }

    const fn byte(mut self, b: u8) -> Self {
        assert!(
            self.len < SQL_CAPACITY,
            "idem: transition statement too long"
        );
        self.buf[self.len] = b;
        self.len += 1;
        self
    }

    /// The next bound parameter: `?`, or `$n` for Postgres.
    const fn param(mut self) -> Self {
        self.params += 1;
        match self.dialect {
            Dialect::SQLite | Dialect::MySQL => self.push("?"),
            Dialect::Postgres => {
                self = self.push("$");
                let n = self.params;
                if n >= 100 {
                    self = self.digit(n / 100);
                }
                if n >= 10 {
                    self = self.digit(n / 10 % 10);
                }
                self.digit(n % 10)
            }
        }
    }

    const fn digit(self, d: usize) -> Self {
        const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
        self.push(DIGITS[d])
    }

    /// The statement.
    pub const fn as_str(&self) -> &str {
        match core::str::from_utf8(self.buf.split_at(self.len).0) {
            Ok(text) => text,
            Err(_) => panic!("idem: transition statement is not UTF-8"),
        }
    }
}

impl fmt::Debug for SqlText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for SqlText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The columns a `#[state_transition]` writes and compares, as the attribute names them.
#[derive(Debug, Clone, Copy)]
pub struct TransitionShape {
    /// `set(col = …)` columns, bound in this order after the target state.
    pub set: &'static [&'static str],
    /// The column set to the database's current time (`now = "paid_at"`).
    pub now: Option<&'static str>,
    /// Columns (among `set`) that must equal the bound values for a repeat to count as applied.
    pub matches: &'static [&'static str],
    /// How many `from` states.
    pub from_count: usize,
    /// Whether the update compares the version column with an expected version (`version = …`).
    /// A machine with a version column bumps it on every transition either way.
    pub versioned: bool,
}

/// The two statements of one transition in one dialect.
///
/// Update binds: target state, `set` values, key, `from` states, expected version.
/// Read binds: target state, `match` values, key; it returns the status, `1`/`0` for "already in the
/// target state with matching columns", and the version when the machine has one.
#[derive(Debug, Clone, Copy)]
pub struct DialectSql {
    /// `UPDATE … WHERE key = ? AND status IN (…)`.
    pub update: SqlText,
    /// `SELECT status, CASE WHEN … END … WHERE key = ?` (plus `FOR UPDATE` but on SQLite).
    pub read: SqlText,
}

/// The statements of one transition for every backend, built at compile time.
#[derive(Debug, Clone, Copy)]
pub struct TransitionSql {
    /// SQLite (`?`).
    pub sqlite: DialectSql,
    /// MySQL / MariaDB (`?`, `FOR UPDATE`).
    pub mysql: DialectSql,
    /// Postgres (`$n`, `FOR UPDATE`).
    pub postgres: DialectSql,
}

impl TransitionSql {
    /// The statements of a transition of `M` with `shape`.
    pub const fn build<M: StateMachine>(shape: &TransitionShape) -> Self {
        TransitionSql {
            sqlite: dialect_sql::<M>(shape, Dialect::SQLite),
            mysql: dialect_sql::<M>(shape, Dialect::MySQL),
            postgres: dialect_sql::<M>(shape, Dialect::Postgres),
        }
    }

    /// The statements in `dialect`.
    pub const fn get(&self, dialect: Dialect) -> &DialectSql {
        match dialect {
            Dialect::SQLite => &self.sqlite,
            Dialect::MySQL => &self.mysql,
            Dialect::Postgres => &self.postgres,
        }
    }
}

const fn dialect_sql<M: StateMachine>(shape: &TransitionShape, dialect: Dialect) -> DialectSql {
    let status = M::STATUS_COLUMN;
    // UPDATE t SET status = ?, c = ?, now = CURRENT_TIMESTAMP, version = version + 1
    // WHERE key = ? AND status IN (?, ?) AND version = ?
    let mut update = SqlText::new(dialect)
        .push("UPDATE ")
        .ident(M::TABLE)
        .push(" SET ")
        .ident(status)
        .push(" = ")
        .param();
    let mut i = 0;
    while i < shape.set.len() {
        update = update.push(", ").ident(shape.set[i]).push(" = ").param();
        i += 1;
    }
    if let Some(now) = shape.now {
        update = update
            .push(", ")
            .ident(now)
            .push(" = ")
            .push(dialect.current_timestamp());
    }
    // A machine with a version column: every transition bumps it (only `version = …` compares it),
    // so a reader holding an old version never mistakes a moved row for an unchanged one.
    if let Some(version) = M::VERSION_COLUMN {
        update = update
            .push(", ")
            .ident(version)
            .push(" = ")
            .ident(version)
            .push(" + 1");
    }
    update = update
        .push(" WHERE ")
        .ident(M::KEY_COLUMN)
        .push(" = ")
        .param()
        .push(" AND ")
        .ident(status);
    if shape.from_count == 1 {
        update = update.push(" = ").param();
    } else {
        update = update.push(" IN (");
        let mut i = 0;
        while i < shape.from_count {
            if i > 0 {
                update = update.push(", ");
            }
            update = update.param();
            i += 1;
        }
        update = update.push(")");
    }
    if shape.versioned
        && let Some(version) = M::VERSION_COLUMN
    {
        update = update.push(" AND ").ident(version).push(" = ").param();
    }

    // SELECT status, CASE WHEN status = ? AND c = ? THEN 1 ELSE 0 END, version FROM t WHERE key = ?
    let mut read = SqlText::new(dialect)
        .push("SELECT ")
        .ident(status)
        .push(", CASE WHEN ")
        .ident(status)
        .push(" = ")
        .param();
    let mut i = 0;
    while i < shape.matches.len() {
        read = read
            .push(" AND ")
            .ident(shape.matches[i])
            .push(" = ")
            .param();
        i += 1;
    }
    read = read.push(" THEN 1 ELSE 0 END");
    if let Some(version) = M::VERSION_COLUMN {
        read = read.push(", ").ident(version);
    }
    read = read
        .push(" FROM ")
        .ident(M::TABLE)
        .push(" WHERE ")
        .ident(M::KEY_COLUMN)
        .push(" = ")
        .param()
        .push(dialect.locking_read());
    DialectSql { update, read }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transition::StateMachine;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum S {
        A,
        B,
    }

    impl StateMachine for S {
        const NAME: &'static str = "S";
        const TABLE: &'static str = "order";
        const KEY_COLUMN: &'static str = "key";
        const STATUS_COLUMN: &'static str = "status";
        const VERSION_COLUMN: Option<&'static str> = Some("version");
        const STATES: &'static [&'static str] = &["A", "B"];
        const TERMINAL: &'static [&'static str] = &["B"];
        const EDGES: &'static [(&'static str, &'static str)] = &[("A", "B")];
        fn as_str(self) -> &'static str {
            match self {
                S::A => "A",
                S::B => "B",
            }
        }
        fn parse(name: &str) -> Option<Self> {
            match name {
                "A" => Some(S::A),
                "B" => Some(S::B),
                _ => None,
            }
        }
    }

    static SQL: TransitionSql = TransitionSql::build::<S>(&TransitionShape {
        set: &["trade_no"],
        now: Some("paid_at"),
        matches: &["trade_no"],
        from_count: 2,
        versioned: true,
    });

    /// The table `order` and the key column `key` are reserved words: quoted per dialect, they work.
    #[test]
    fn builds_every_dialect_with_quoted_identifiers() {
        assert_eq!(
            SQL.sqlite.update.as_str(),
            "UPDATE \"order\" SET \"status\" = ?, \"trade_no\" = ?, \"paid_at\" = CURRENT_TIMESTAMP, \
             \"version\" = \"version\" + 1 WHERE \"key\" = ? AND \"status\" IN (?, ?) AND \"version\" = ?"
        );
        assert_eq!(
            SQL.mysql.update.as_str(),
            "UPDATE `order` SET `status` = ?, `trade_no` = ?, `paid_at` = CURRENT_TIMESTAMP, \
             `version` = `version` + 1 WHERE `key` = ? AND `status` IN (?, ?) AND `version` = ?"
        );
        assert_eq!(
            SQL.postgres.update.as_str(),
            "UPDATE \"order\" SET \"status\" = $1, \"trade_no\" = $2, \"paid_at\" = CURRENT_TIMESTAMP, \
             \"version\" = \"version\" + 1 WHERE \"key\" = $3 AND \"status\" IN ($4, $5) AND \"version\" = $6"
        );
        assert_eq!(
            SQL.sqlite.read.as_str(),
            "SELECT \"status\", CASE WHEN \"status\" = ? AND \"trade_no\" = ? THEN 1 ELSE 0 END, \"version\" \
             FROM \"order\" WHERE \"key\" = ?"
        );
        assert_eq!(
            SQL.mysql.read.as_str(),
            "SELECT `status`, CASE WHEN `status` = ? AND `trade_no` = ? THEN 1 ELSE 0 END, `version` \
             FROM `order` WHERE `key` = ? FOR UPDATE"
        );
        assert_eq!(
            SQL.postgres.read.as_str(),
            "SELECT \"status\", CASE WHEN \"status\" = $1 AND \"trade_no\" = $2 THEN 1 ELSE 0 END, \"version\" \
             FROM \"order\" WHERE \"key\" = $3 FOR UPDATE"
        );
        assert!(S::A.can_move_to(S::B) && !S::B.can_move_to(S::A) && S::B.is_terminal());
    }

    /// Without `version = …` the version is not compared, but it is still bumped.
    #[test]
    fn every_transition_bumps_the_version() {
        let sql = TransitionSql::build::<S>(&TransitionShape {
            set: &[],
            now: None,
            matches: &[],
            from_count: 1,
            versioned: false,
        });
        assert_eq!(
            sql.sqlite.update.as_str(),
            "UPDATE \"order\" SET \"status\" = ?, \"version\" = \"version\" + 1 WHERE \"key\" = ? AND \"status\" = ?"
        );
    }
}
