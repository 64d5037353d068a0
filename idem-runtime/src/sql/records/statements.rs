//! The record layer's statements: each with the values its placeholders ask for, in order
//! ([`Param`]; the dialects with numbered placeholders share [`numbered`]), and the set of them a
//! table has ([`RecordStatements`]). Each backend's `statements.rs` writes their text.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

#[cfg(doc)]
use super::RecordDb;

/// A value a record statement binds. A statement lists them in the order its placeholders ask for
/// them: once each where placeholders are numbered (`$1`, `?1`), as often as they appear where
/// they are not (MySQL's `?`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Param {
    /// The business type.
    Biz,
    /// The idempotency key.
    Key,
    /// The fence of the claim that holds the record.
    Fence,
    /// The result snapshot (complete) or the saved steps (save steps).
    Blob,
    /// The record's time to live, in milliseconds.
    Ttl,
    /// A lease, in milliseconds.
    Lease,
    /// How long a result is kept, in milliseconds (NULL: as long as the record).
    ResultTtl,
    /// The store's clock as [`RecordDb::clock`] gives it.
    Clock,
    /// How many rows a pass changes or reads at most.
    Batch,
}

/// The parameter order of the dialects whose placeholders are numbered (Postgres's `$n`, SQLite's
/// `?n`): what `$1`, `$2` … mean in each statement.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) mod numbered {
    use super::Param::{self, *};

    /// `$1` biz, `$2` key, `$3` fence, `$4` result, `$5` ttl, `$6` clock, `$7` result ttl.
    pub(crate) const COMPLETE: &[Param] = &[Biz, Key, Fence, Blob, Ttl, Clock, ResultTtl];
    /// `$1` biz, `$2` key, `$3` fence, `$4` clock.
    pub(crate) const FAIL: &[Param] = &[Biz, Key, Fence, Clock];
    /// `$1` biz, `$2` key, `$3` fence, `$4` steps, `$5` clock.
    pub(crate) const SAVE_STEPS: &[Param] = &[Biz, Key, Fence, Blob, Clock];
    /// `$1` biz, `$2` key, `$3` fence, `$4` lease, `$5` clock.
    pub(crate) const RENEW: &[Param] = &[Biz, Key, Fence, Lease, Clock];
    /// `$1` biz, `$2` key, `$3` clock.
    pub(crate) const READ: &[Param] = &[Biz, Key, Clock];
    /// `$1` biz, `$2` key.
    pub(crate) const LOAD: &[Param] = &[Biz, Key];
    /// `$1` biz, `$2` clock, `$3` batch.
    pub(crate) const STUCK: &[Param] = &[Biz, Clock, Batch];
    /// `$1` clock.
    pub(crate) const STATS: &[Param] = &[Clock];
    /// `$1` batch.
    pub(crate) const KEYS_FIRST: &[Param] = &[Batch];
    /// `$1` biz, `$2` key (the last pair of the page before), `$3` batch.
    pub(crate) const KEYS_AFTER: &[Param] = &[Biz, Key, Batch];
    /// `$1` batch, `$2` clock.
    pub(crate) const SWEEP: &[Param] = &[Batch, Clock];
    /// `$1` batch, `$2` clock.
    pub(crate) const SHRINK: &[Param] = &[Batch, Clock];
}

/// A statement and the values its placeholders ask for, in order.
#[derive(Debug, Clone)]
pub(crate) struct Stmt {
    pub(super) sql: SqlStr,
    pub(super) params: &'static [Param],
}

impl Stmt {
    /// `sql` (its table name validated and quoted: the text is the store's own) binding `params`.
    /// The text is shared, so each call's query costs a reference count, not a copy.
    pub(crate) fn new(sql: String, params: &'static [Param]) -> Self {
        Stmt {
            sql: AssertSqlSafe(Arc::<str>::from(sql)).into_sql_str(),
            params,
        }
    }

    /// The statement's text.
    #[cfg(any(
        feature = "mysql",
        all(feature = "postgres", any(test, feature = "test-util"))
    ))]
    pub(crate) fn as_str(&self) -> &str {
        self.sql.as_str()
    }

    /// The values its placeholders ask for, in order.
    #[cfg(feature = "mysql")]
    pub(crate) fn params(&self) -> &'static [Param] {
        self.params
    }
}

/// The record statements of one table, in its dialect.
#[derive(Debug, Clone)]
pub(crate) struct RecordStatements {
    /// Marks the held record SUCCEEDED with its result (a mark sent again counts as held).
    pub(crate) complete: Stmt,
    /// `complete`, then a statement that fails unless it changed the record, then `COMMIT`: a
    /// transaction's last mark and its commit in one round trip, committing only when the mark
    /// landed. `None` where statements with parameters cannot be sent together (the servers).
    pub(crate) complete_commit: Option<Stmt>,
    /// Marks the held record FAILED (its saved steps stay for a retry).
    pub(crate) fail: Stmt,
    /// Saves the held record's finished steps.
    pub(crate) save_steps: Stmt,
    /// Extends the held record's lease.
    pub(crate) renew: Stmt,
    /// The claim's plain read, with the clock as `now_ms` (`store/order.rs`).
    pub(crate) read: Stmt,
    /// The record, for an operator or a recovery.
    pub(crate) load: Stmt,
    /// PROCESSING records whose lease ended, oldest lease first, with `idem_key`.
    pub(crate) stuck: Stmt,
    /// Records per business type, origin and status (`n`), and the tombstones among them (`gone`).
    pub(crate) stats: Stmt,
    /// The business types with PROCESSING records, `biz_type` (the stuck index's range).
    pub(crate) processing_biz: Stmt,
    /// The first page of a walk of every record: `biz_type` and `idem_key` in the primary key's
    /// order, at most [`Param::Batch`] rows.
    pub(crate) keys_first: Stmt,
    /// A later page: the same after the pair bound at [`Param::Biz`] and [`Param::Key`], a range
    /// of the primary key.
    pub(crate) keys_after: Stmt,
    /// Deletes a batch of expired records.
    pub(crate) sweep: Stmt,
    /// Drops a batch of results past their result ttl, keeping the records as tombstones.
    pub(crate) shrink: Stmt,
}
