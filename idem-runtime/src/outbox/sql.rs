//! The outbox table's statements, per dialect. Times are milliseconds by the database's clock, so
//! relays on several machines agree on leases and back-off whatever their own clocks say.

use crate::sql::dialect::Dialect;
use crate::sql::table::TableName;

/// Every statement the outbox and its relay send, for one table in one dialect.
#[derive(Debug, Clone)]
pub(crate) struct OutboxSql {
    /// `CREATE TABLE IF NOT EXISTS` and its index, in order.
    pub(crate) ddl: Vec<String>,
    /// `(destination, key, payload)` → a pending row (SQLite and Postgres return its id).
    pub(crate) insert: String,
    /// `(batch)` → `(id, destination, msg_key, payload, attempts)` of pending rows due now, not
    /// leased, and each the oldest pending row of its destination and key, in id order.
    pub(crate) due: String,
    /// `(owner, lease ms, id)` → 1 row when this relay now holds the row.
    pub(crate) lease: String,
    /// `(id, owner)` → the row is sent, if this relay still holds it.
    pub(crate) sent: String,
    /// `(back-off ms, error, id, owner)` → the row is due again later.
    pub(crate) failed: String,
    /// `(retention ms, batch)` → sent rows older than the retention deleted.
    pub(crate) sweep: String,
    /// `()` → pending rows.
    pub(crate) pending: String,
}

impl OutboxSql {
    pub(crate) fn new(table: &TableName, dialect: Dialect) -> Self {
        let t = table.quoted(dialect);
        let now = dialect.now_ms();
        let p = |n: usize| match dialect {
            Dialect::Postgres => format!("${n}"),
            _ => "?".to_owned(),
        };
        let index = dialect.quote_ident(&table.unique_index_name("pending"));
        let ddl = ddl(dialect, &t, &index);
        let returning = match dialect {
            Dialect::MySQL => "",
            _ => " RETURNING id",
        };
        let insert = format!(
            "INSERT INTO {t} (destination, msg_key, payload, created_at, next_attempt_at) \
             VALUES ({}, {}, {}, {now}, {now}){returning}",
            p(1),
            p(2),
            p(3)
        );
        let due = format!(
            "SELECT o.id, o.destination, o.msg_key, o.payload, o.attempts FROM {t} o \
             WHERE o.sent_at IS NULL AND o.next_attempt_at <= {now} AND o.lease_until <= {now} \
             AND NOT EXISTS (SELECT 1 FROM {t} e WHERE e.sent_at IS NULL \
             AND e.destination = o.destination AND e.msg_key = o.msg_key AND e.id < o.id) \
             ORDER BY o.id LIMIT {}",
            p(1)
        );
        let lease = format!(
            "UPDATE {t} SET lease_owner = {}, lease_until = {now} + {} \
             WHERE id = {} AND sent_at IS NULL AND lease_until <= {now}",
            p(1),
            p(2),
            p(3)
        );
        let sent = format!(
            "UPDATE {t} SET sent_at = {now}, lease_owner = NULL, last_error = NULL \
             WHERE id = {} AND lease_owner = {} AND sent_at IS NULL",
            p(1),
            p(2)
        );
        let failed = format!(
            "UPDATE {t} SET attempts = attempts + 1, next_attempt_at = {now} + {}, \
             lease_owner = NULL, lease_until = 0, last_error = {} \
             WHERE id = {} AND lease_owner = {} AND sent_at IS NULL",
            p(1),
            p(2),
            p(3),
            p(4)
        );
        let sweep = match dialect {
            Dialect::MySQL => format!(
                "DELETE FROM {t} WHERE sent_at IS NOT NULL AND sent_at <= {now} - ? \
                 ORDER BY id LIMIT ?"
            ),
            _ => format!(
                "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE sent_at IS NOT NULL \
                 AND sent_at <= {now} - {} ORDER BY id LIMIT {})",
                p(1),
                p(2)
            ),
        };
        let pending = format!("SELECT COUNT(*) FROM {t} WHERE sent_at IS NULL");
        OutboxSql {
            ddl,
            insert,
            due,
            lease,
            sent,
            failed,
            sweep,
            pending,
        }
    }
}

/// The table and its index of pending rows per destination and key (MySQL declares the index in
/// the table), in the order they are run.
fn ddl(dialect: Dialect, t: &str, index: &str) -> Vec<String> {
    match dialect {
        Dialect::SQLite => vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                 id INTEGER PRIMARY KEY AUTOINCREMENT, \
                 destination TEXT NOT NULL, \
                 msg_key TEXT NOT NULL, \
                 payload BLOB NOT NULL, \
                 created_at INTEGER NOT NULL, \
                 attempts INTEGER NOT NULL DEFAULT 0, \
                 next_attempt_at INTEGER NOT NULL, \
                 lease_owner TEXT NULL, \
                 lease_until INTEGER NOT NULL DEFAULT 0, \
                 sent_at INTEGER NULL, \
                 last_error TEXT NULL)"
            ),
            format!(
                "CREATE INDEX IF NOT EXISTS {index} ON {t} (destination, msg_key, id) \
                 WHERE sent_at IS NULL"
            ),
        ],
        Dialect::MySQL => vec![format!(
            "CREATE TABLE IF NOT EXISTS {t} (\
             id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
             destination VARCHAR(255) NOT NULL, \
             msg_key VARCHAR(255) NOT NULL, \
             payload MEDIUMBLOB NOT NULL, \
             created_at BIGINT NOT NULL, \
             attempts INT NOT NULL DEFAULT 0, \
             next_attempt_at BIGINT NOT NULL, \
             lease_owner VARCHAR(64) NULL, \
             lease_until BIGINT NOT NULL DEFAULT 0, \
             sent_at BIGINT NULL, \
             last_error VARCHAR(1024) NULL, \
             KEY {index} (sent_at, destination, msg_key, id)\
             ) ENGINE=InnoDB"
        )],
        Dialect::Postgres => vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                 id BIGSERIAL PRIMARY KEY, \
                 destination TEXT NOT NULL, \
                 msg_key TEXT NOT NULL, \
                 payload BYTEA NOT NULL, \
                 created_at BIGINT NOT NULL, \
                 attempts INT NOT NULL DEFAULT 0, \
                 next_attempt_at BIGINT NOT NULL, \
                 lease_owner TEXT NULL, \
                 lease_until BIGINT NOT NULL DEFAULT 0, \
                 sent_at BIGINT NULL, \
                 last_error TEXT NULL)"
            ),
            format!(
                "CREATE INDEX IF NOT EXISTS {index} ON {t} (destination, msg_key, id) \
                 WHERE sent_at IS NULL"
            ),
        ],
    }
}
