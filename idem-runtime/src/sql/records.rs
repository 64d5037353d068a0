//! The record layer of every SQL store, written once: marking a held record (complete, fail, save
//! steps, renew), reading it (the claim's read, load, stuck), counting and sweeping records.
//!
//! What differs per database is small and lives in its backend's `records.rs`: the statements'
//! text (`statements.rs`), the order in which a statement's placeholders ask for their values
//! ([`Param`]; the dialects with numbered placeholders share [`numbered`]), what the store binds
//! for "now" ([`RecordDb::clock`]), and how the columns whose SQL types differ are read
//! ([`RecordDb::attempt`], [`RecordDb::fence`], [`RecordDb::text`]). The claim's insert and
//! takeover stay per backend too (`sql/claim.rs`'s [`CasRecords`](super::claim::CasRecords)):
//! they are where the databases really differ (`RETURNING`, `LAST_INSERT_ID`, advisory locks).
//!
//! Every statement changing a held record names its fence: one row changed means the claim still
//! holds the record; none means another claim took it over ([`IdemError::LeaseLost`]).

use std::time::Duration;

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Type};

use super::claim::SeenRecord;
use crate::IdemError;
use crate::store::decide::millis;
use crate::store::keys::{after_key, check_batch, not_a_cursor, parse_after_key};
use crate::store::{Claim, ClaimRequest, Fence, KeyPage, Record, Status, StatusCount};

mod db;
mod statements;

pub use db::RecordDb;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) use db::hex_digits;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use db::in_range;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use statements::numbered;
pub(crate) use statements::{Param, RecordStatements, Stmt};

/// The values a statement may ask for; each takes what its [`Param`]s name.
#[derive(Default)]
struct Args<'a> {
    biz: &'a str,
    key: &'a str,
    fence: i64,
    blob: &'a [u8],
    ttl: i64,
    lease: i64,
    result_ttl: Option<i64>,
    batch: i64,
}

impl<'a> Args<'a> {
    fn record(biz: &'a str, key: &'a str) -> Self {
        Args {
            biz,
            key,
            ..Args::default()
        }
    }

    /// The record held under `claim`.
    fn held(biz: &'a str, key: &'a str, claim: &Claim) -> Result<Self, IdemError> {
        let fence = i64::try_from(claim.fence.get()).map_err(|_| IdemError::LeaseLost {
            attempt: claim.attempt,
        })?;
        Ok(Args {
            fence,
            ..Args::record(biz, key)
        })
    }

    /// The mark of success of the record held under `claim`.
    fn marked(
        biz: &'a str,
        key: &'a str,
        claim: &Claim,
        snapshot: &'a [u8],
        ttl: Duration,
        result_ttl: Option<Duration>,
    ) -> Result<Self, IdemError> {
        Ok(Args {
            blob: snapshot,
            ttl: millis(ttl),
            result_ttl: result_ttl.map(millis),
            ..Args::held(biz, key, claim)?
        })
    }

    fn batch(batch: usize) -> Self {
        Args {
            batch: i64::try_from(batch).unwrap_or(i64::MAX),
            ..Args::default()
        }
    }
}

/// The records of one table, reached through one connection (a pool connection, or the caller's
/// transaction).
pub(crate) struct RecordConn<'c, DB: Database> {
    conn: &'c mut DB::Connection,
    sql: &'c RecordStatements,
    offset: i64,
}

impl<'c, DB: RecordDb> RecordConn<'c, DB>
where
    for<'e> &'e mut DB::Connection: Executor<'e, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'t> &'t str: Encode<'t, DB> + Type<DB> + Decode<'t, DB>,
    for<'t> &'t [u8]: Encode<'t, DB> + Type<DB>,
    for<'t> bool: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Type<DB> + Decode<'t, DB>,
    for<'t> Option<i64>: Encode<'t, DB> + Type<DB> + Decode<'t, DB>,
    for<'t> String: Decode<'t, DB> + Type<DB>,
    for<'t> Option<String>: Decode<'t, DB> + Type<DB>,
    for<'t> Option<Vec<u8>>: Decode<'t, DB> + Type<DB>,
    for<'n> &'n str: ColumnIndex<DB::Row>,
{
    /// The records `sql` reaches through `conn`, the store's clock offset `offset` (see
    /// [`RecordDb::clock`]).
    pub(crate) fn new(
        conn: &'c mut DB::Connection,
        sql: &'c RecordStatements,
        offset: i64,
    ) -> Self {
        RecordConn { conn, sql, offset }
    }

    /// The connection, for the backend's own statements.
    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        self.conn
    }

    /// The store's clock offset, as the store gave it.
    pub(crate) fn offset(&self) -> i64 {
        self.offset
    }

    /// `stmt` with the values it asks for bound.
    fn query(
        &self,
        stmt: &Stmt,
        args: &Args<'_>,
    ) -> sqlx::query::Query<'static, DB, DB::Arguments> {
        let clock = DB::clock(self.offset);
        stmt.params
            .iter()
            .fold(sqlx::query(stmt.sql.clone()), |q, param| match param {
                Param::Biz => q.bind(args.biz),
                Param::Key => q.bind(args.key),
                Param::Fence => q.bind(args.fence),
                Param::Blob => q.bind(args.blob),
                Param::Ttl => q.bind(args.ttl),
                Param::Lease => q.bind(args.lease),
                Param::ResultTtl => q.bind(args.result_ttl),
                Param::Clock => q.bind(clock),
                Param::Batch => q.bind(args.batch),
            })
    }

    /// Runs `stmt`: how many rows it changed.
    async fn execute(&mut self, stmt: &Stmt, args: &Args<'_>) -> Result<u64, IdemError> {
        let done = self
            .query(stmt, args)
            .execute(&mut *self.conn)
            .await
            .map_err(DB::error)?;
        Ok(DB::rows_affected(&done))
    }

    /// Changes the record held under `claim` with `stmt`.
    async fn held(&mut self, stmt: &Stmt, args: &Args<'_>, claim: &Claim) -> Result<(), IdemError> {
        if self.execute(stmt, args).await? == 1 {
            Ok(())
        } else {
            Err(IdemError::LeaseLost {
                attempt: claim.attempt,
            })
        }
    }

    /// The claim's plain read of `req`'s record with `stmt` (the store's `read`, or a locking
    /// variant with the same parameters).
    pub(crate) async fn read_with(
        &mut self,
        stmt: &Stmt,
        req: &ClaimRequest<'_>,
    ) -> Result<Option<SeenRecord>, IdemError> {
        let row = self
            .query(stmt, &Args::record(req.biz, req.key))
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(DB::error)?;
        row.as_ref().map(Self::seen).transpose()
    }

    /// The claim's plain read of `req`'s record.
    pub(crate) async fn read(
        &mut self,
        req: &ClaimRequest<'_>,
    ) -> Result<Option<SeenRecord>, IdemError> {
        let sql = self.sql;
        self.read_with(&sql.read, req).await
    }

    /// A takeover whose statement returns the new `attempt` and `fence` (`RETURNING`): `query`,
    /// the claim's values bound, then `reset`, the seen fence, status and lease end, and
    /// `keep_steps`. `None` when the record changed since it was read.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) async fn take_returning(
        &mut self,
        query: sqlx::query::Query<'_, DB, DB::Arguments>,
        seen: &SeenRecord,
        reset: bool,
        keep_steps: bool,
    ) -> Result<Option<Claim>, IdemError> {
        let row = query
            .bind(reset)
            .bind(i64::try_from(seen.fence).unwrap_or(i64::MAX))
            .bind(seen.status.as_str())
            .bind(seen.lease_until_ms)
            .bind(keep_steps)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(DB::error)?;
        row.map(|row| {
            Ok(Claim {
                attempt: DB::attempt(&row)?,
                fence: Fence::new(DB::fence(&row)?),
            })
        })
        .transpose()
    }

    /// The record `(biz, key)` from a row with the columns of `load`.
    fn record(row: &DB::Row, biz: &str, key: String) -> Result<Record, IdemError> {
        let status = Status::parse(row.try_get("status").map_err(DB::error)?)?;
        let (snapshot, steps) =
            Record::split_blob(status, row.try_get("result").map_err(DB::error)?);
        Ok(Record {
            biz: biz.to_owned(),
            key,
            status,
            attempt: DB::attempt(row)?,
            fence: Fence::new(DB::fence(row)?),
            fingerprint: row.try_get("fingerprint").map_err(DB::error)?,
            snapshot,
            steps,
            lease_until_ms: row.try_get("lease_until").map_err(DB::error)?,
            expire_at_ms: row.try_get("expire_at").map_err(DB::error)?,
            result_until_ms: row.try_get("result_until").map_err(DB::error)?,
        })
    }

    /// The claim's view of a row with the columns of the claim or the read, and `now_ms`.
    /// What rows read for many keys (each with its `idem_key`) say of each of `reqs`, in order:
    /// its record, or `None`.
    pub(crate) fn seen_by_key(
        rows: &[DB::Row],
        reqs: &[ClaimRequest<'_>],
    ) -> Result<Vec<Option<SeenRecord>>, IdemError> {
        let mut found = std::collections::HashMap::with_capacity(rows.len());
        for row in rows {
            found.insert(DB::text(row, "idem_key")?, Self::seen(row)?);
        }
        Ok(reqs.iter().map(|r| found.remove(r.key)).collect())
    }

    /// The answers of a batch of marks whose statement returned the `idem_key` of each record it
    /// marked: each mark whose key is not among them lost its claim.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn marked(
        rows: &[DB::Row],
        marks: &[crate::store::BatchMark<'_>],
    ) -> Result<Vec<Result<(), IdemError>>, IdemError> {
        let mut done = std::collections::HashSet::with_capacity(rows.len());
        for row in rows {
            done.insert(DB::text(row, "idem_key")?);
        }
        Ok(marks
            .iter()
            .map(|m| match done.contains(m.key) {
                true => Ok(()),
                false => Err(IdemError::LeaseLost {
                    attempt: m.claim.attempt,
                }),
            })
            .collect())
    }

    pub(crate) fn seen(row: &DB::Row) -> Result<SeenRecord, IdemError> {
        Ok(SeenRecord {
            status: Status::parse(row.try_get("status").map_err(DB::error)?)?,
            attempt: DB::attempt(row)?,
            fence: DB::fence(row)?,
            fingerprint: row.try_get("fingerprint").map_err(DB::error)?,
            snapshot: row.try_get("result").map_err(DB::error)?,
            lease_until_ms: row.try_get("lease_until").map_err(DB::error)?,
            expire_at_ms: row.try_get("expire_at").map_err(DB::error)?,
            result_until_ms: row.try_get("result_until").map_err(DB::error)?,
            now_ms: row.try_get("now_ms").map_err(DB::error)?,
        })
    }
}

/// The record layer's statements on a held or stored record, as the [`Store`](crate::Store) impl
/// and the transactions call them (a trait so that code generic over the database calls them
/// without restating sqlx's bounds: [`RecordConn`] implements it once, for every [`RecordDb`]).
#[async_trait::async_trait]
pub(crate) trait Records: Send {
    /// Marks the record held under `claim` done with `snapshot`, kept `ttl` (its result
    /// `result_ttl`, or as long as the record). [`IdemError::LeaseLost`] when another claim
    /// took it over.
    async fn complete(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Option<Duration>,
    ) -> Result<(), IdemError>;

    /// [`Records::complete`] as the last statement of the transaction this runs in, sent with
    /// its `COMMIT` in one round trip; the commit runs only when the mark landed (else
    /// [`IdemError::LeaseLost`], and the transaction stays open, to be rolled back).
    ///
    /// # Errors
    /// As [`Records::complete`]; [`IdemError::NotSupported`] where the database has no such
    /// statement ([`RecordStatements::complete_commit`]).
    #[allow(clippy::too_many_arguments)]
    async fn complete_and_commit(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Option<Duration>,
    ) -> Result<(), IdemError>;

    /// Marks the record held under `claim` failed, so a retry may claim it.
    async fn fail(&mut self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError>;

    /// Saves the steps a multi-step body finished, under `claim`.
    async fn save_steps(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError>;

    /// Extends the lease of the record held under `claim` by `lease` from now.
    async fn renew(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError>;

    /// The record `(biz, key)`, if any.
    async fn load(&mut self, biz: &str, key: &str) -> Result<Option<Record>, IdemError>;

    /// Up to `batch` records of `biz` in progress whose lease ran out.
    async fn stuck(&mut self, biz: &str, batch: usize) -> Result<Vec<Record>, IdemError>;

    /// The business types with a record in progress, sorted.
    async fn processing_biz_types(&mut self) -> Result<Vec<String>, IdemError>;

    /// A page of the walk of every record's key, in the primary key's order, after the pair the
    /// `after` cursor names ([`after_key`]). One row more than the page is read, so the last page
    /// says the walk is done.
    async fn list_keys(&mut self, after: Option<&str>, batch: usize) -> Result<KeyPage, IdemError>;

    /// How many records there are per business type, origin and status.
    async fn stats(&mut self) -> Result<Vec<StatusCount>, IdemError>;

    /// Deletes a batch of expired records, then drops a batch of results past their result ttl:
    /// how many records either changed.
    async fn sweep(&mut self, batch: usize) -> Result<u64, IdemError>;
}

#[async_trait::async_trait]
impl<'c, DB: RecordDb> Records for RecordConn<'c, DB>
where
    for<'e> &'e mut DB::Connection: Executor<'e, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'t> &'t str: Encode<'t, DB> + Type<DB> + Decode<'t, DB>,
    for<'t> &'t [u8]: Encode<'t, DB> + Type<DB>,
    for<'t> bool: Encode<'t, DB> + Type<DB>,
    for<'t> i64: Encode<'t, DB> + Type<DB> + Decode<'t, DB>,
    for<'t> Option<i64>: Encode<'t, DB> + Type<DB> + Decode<'t, DB>,
    for<'t> String: Decode<'t, DB> + Type<DB>,
    for<'t> Option<String>: Decode<'t, DB> + Type<DB>,
    for<'t> Option<Vec<u8>>: Decode<'t, DB> + Type<DB>,
    for<'n> &'n str: ColumnIndex<DB::Row>,
{
    async fn complete(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Option<Duration>,
    ) -> Result<(), IdemError> {
        let args = Args::marked(biz, key, claim, snapshot, ttl, result_ttl)?;
        let sql = self.sql;
        self.held(&sql.complete, &args, claim).await
    }

    async fn complete_and_commit(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Option<Duration>,
    ) -> Result<(), IdemError> {
        let sql = self.sql;
        let Some(stmt) = &sql.complete_commit else {
            return Err(IdemError::NotSupported {
                backend: DB::DIALECT.server(),
                what: "a mark sent with its transaction's commit",
            });
        };
        let args = Args::marked(biz, key, claim, snapshot, ttl, result_ttl)?;
        match self.query(stmt, &args).execute(&mut *self.conn).await {
            Ok(_) => Ok(()),
            // The guard's refusal: the mark changed nothing, so nothing was committed.
            Err(sqlx::Error::Database(e))
                if e.kind() == sqlx::error::ErrorKind::NotNullViolation =>
            {
                Err(IdemError::LeaseLost {
                    attempt: claim.attempt,
                })
            }
            Err(e) => Err(DB::error(e)),
        }
    }

    async fn fail(&mut self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        let args = Args::held(biz, key, claim)?;
        let sql = self.sql;
        self.held(&sql.fail, &args, claim).await
    }

    async fn save_steps(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        let args = Args {
            blob: steps,
            ..Args::held(biz, key, claim)?
        };
        let sql = self.sql;
        self.held(&sql.save_steps, &args, claim).await
    }

    async fn renew(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        let args = Args {
            lease: millis(lease),
            ..Args::held(biz, key, claim)?
        };
        let sql = self.sql;
        self.held(&sql.renew, &args, claim).await
    }

    async fn load(&mut self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        if !DB::holds(biz) || !DB::holds(key) {
            return Ok(None);
        }
        let Some(row) = self
            .query(&self.sql.load, &Args::record(biz, key))
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(DB::error)?
        else {
            return Ok(None);
        };
        Self::record(&row, biz, key.to_owned()).map(Some)
    }

    async fn stuck(&mut self, biz: &str, batch: usize) -> Result<Vec<Record>, IdemError> {
        if !DB::holds(biz) {
            return Ok(Vec::new());
        }
        let args = Args {
            biz,
            ..Args::batch(batch)
        };
        let rows = self
            .query(&self.sql.stuck, &args)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(DB::error)?;
        rows.iter()
            .map(|row| Self::record(row, biz, DB::text(row, "idem_key")?))
            .collect()
    }

    async fn processing_biz_types(&mut self) -> Result<Vec<String>, IdemError> {
        let rows = self
            .query(&self.sql.processing_biz, &Args::default())
            .fetch_all(&mut *self.conn)
            .await
            .map_err(DB::error)?;
        let mut bizes = rows
            .iter()
            .map(|row| DB::text(row, "biz_type"))
            .collect::<Result<Vec<_>, _>>()?;
        bizes.sort_unstable();
        Ok(bizes)
    }

    async fn list_keys(&mut self, after: Option<&str>, batch: usize) -> Result<KeyPage, IdemError> {
        check_batch(batch)?;
        let (stmt, args) = match after {
            None => (&self.sql.keys_first, Args::batch(batch + 1)),
            Some(cursor) => {
                let (biz, key) = parse_after_key(cursor)?;
                if !DB::holds(biz) || !DB::holds(key) {
                    return Err(not_a_cursor(cursor));
                }
                let args = Args {
                    biz,
                    key,
                    ..Args::batch(batch + 1)
                };
                (&self.sql.keys_after, args)
            }
        };
        let rows = self
            .query(stmt, &args)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(DB::error)?;
        let more = rows.len() > batch;
        let keys = rows
            .iter()
            .take(batch)
            .map(|row| Ok((DB::text(row, "biz_type")?, DB::text(row, "idem_key")?)))
            .collect::<Result<Vec<_>, IdemError>>()?;
        let next = match keys.last() {
            Some((biz, key)) if more => Some(after_key(biz, key)),
            _ => None,
        };
        Ok(KeyPage { keys, next })
    }

    async fn stats(&mut self) -> Result<Vec<StatusCount>, IdemError> {
        let rows = self
            .query(&self.sql.stats, &Args::default())
            .fetch_all(&mut *self.conn)
            .await
            .map_err(DB::error)?;
        let counts = rows
            .iter()
            .map(|row| {
                StatusCount::of_row(
                    DB::text(row, "biz_type")?,
                    row.try_get("origin").map_err(DB::error)?,
                    row.try_get("status").map_err(DB::error)?,
                    row.try_get("n").map_err(DB::error)?,
                    row.try_get("gone").map_err(DB::error)?,
                )
            })
            .collect::<Result<Vec<_>, IdemError>>()?;
        Ok(StatusCount::tally(counts))
    }

    async fn sweep(&mut self, batch: usize) -> Result<u64, IdemError> {
        let args = Args::batch(batch);
        let sql = self.sql;
        let swept = self.execute(&sql.sweep, &args).await?;
        Ok(swept + self.execute(&sql.shrink, &args).await?)
    }
}
