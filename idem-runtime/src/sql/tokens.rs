//! The one-time submit tokens every SQL store keeps in its database, written once: [`SqlTokens`]
//! (`PgTokens`, `MySqlTokens` and `SqliteTokens` are it on their database). A backend gives the
//! statements' text with the order their placeholders ask for values ([`TokenStatements`]), and
//! the connection they run on ([`TokenDb`]).
//!
//! Consuming is one conditional flip of the spent flag (`UPDATE … SET spent = … WHERE token = …
//! AND subject = … AND spent = … AND expire_at > now`): the row lock lets exactly one of N
//! concurrent consumers change the row (the others wait for it, then see the flag flipped and
//! change nothing). When nothing changed, a read says why (unknown, spent, expired, another
//! subject).

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Executor, IntoArguments, Row, SqlSafeStr, SqlStr};

use super::records::RecordDb;
use crate::IdemError;
use crate::store::decide::millis;
use crate::tokens::{Found, TokenStore, check_token, check_ttl, new_token, refusal, subject_of};

/// A value a token statement binds, listed in the order its placeholders ask for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenParam {
    /// The token.
    Token,
    /// The subject it was issued for.
    Subject,
    /// The spent flag the row must have to flip.
    Was,
    /// The spent flag it gets.
    Becomes,
    /// The store's clock offset (the test clock).
    Offset,
    /// The token's time to live, in milliseconds.
    Ttl,
    /// How many rows a sweep deletes at most.
    Batch,
}

/// One token statement: its text and the values its placeholders ask for, in order.
#[derive(Debug, Clone)]
pub struct TokenStmt {
    sql: SqlStr,
    params: &'static [TokenParam],
}

impl TokenStmt {
    /// `sql`, whose placeholders ask for `params`.
    pub(crate) fn new(sql: String, params: &'static [TokenParam]) -> Self {
        TokenStmt {
            sql: AssertSqlSafe(sql).into_sql_str(),
            params,
        }
    }
}

/// The token statements of one table.
#[derive(Debug, Clone)]
pub struct TokenStatements {
    /// Inserts a token, unspent.
    pub(crate) issue: TokenStmt,
    /// Flips the spent flag of a live token of its subject.
    pub(crate) flip: TokenStmt,
    /// Reads a token's subject and whether it is live (`subject`, `live`).
    pub(crate) find: TokenStmt,
    /// Deletes expired tokens, a batch at most.
    pub(crate) sweep: TokenStmt,
}

/// The values a token statement may ask for.
#[derive(Debug, Default, Clone, Copy)]
pub struct TokenArgs<'a> {
    token: &'a str,
    subject: &'a str,
    to: bool,
    offset: i64,
    ttl: i64,
    batch: usize,
}

/// What a flip found: done, or the token as it is (`None`: no such token).
pub enum Flip {
    /// The flag flipped.
    Done,
    /// Nothing changed: the token's subject and whether it is live, if there is one.
    Refused(Option<(String, bool)>),
}

/// What the token store needs of a database beyond its statements.
#[async_trait]
pub trait TokenDb: RecordDb {
    /// The store that keeps the tokens.
    type Store: Clone + Send + Sync + 'static;

    /// The backend's name ([`TokenStore::backend`]).
    const BACKEND: &'static str;

    /// The store's token statements.
    fn statements(store: &Self::Store) -> &TokenStatements;

    /// The clock offset the statements bind at [`TokenParam::Offset`].
    fn offset(store: &Self::Store) -> i64;

    /// `query` with `batch` bound, as the integer type the database's `LIMIT` reads (a
    /// signed one unless the database says otherwise).
    fn bind_batch(
        query: sqlx::query::Query<'static, Self, Self::Arguments>,
        batch: usize,
    ) -> sqlx::query::Query<'static, Self, Self::Arguments>
    where
        for<'t> i64: sqlx::Encode<'t, Self> + sqlx::Type<Self>,
    {
        query.bind(i64::try_from(batch).unwrap_or(i64::MAX))
    }

    /// The subject and the liveness [`TokenStatements::find`] read (text and a boolean unless
    /// the database says otherwise).
    fn found(row: &Self::Row) -> Result<(String, bool), IdemError>
    where
        for<'r> String: sqlx::Decode<'r, Self> + sqlx::Type<Self>,
        for<'r> bool: sqlx::Decode<'r, Self> + sqlx::Type<Self>,
        for<'n> &'n str: sqlx::ColumnIndex<Self::Row>,
    {
        Ok((
            row.try_get("subject").map_err(Self::error)?,
            row.try_get("live").map_err(Self::error)?,
        ))
    }

    /// Runs `stmt` on one of the store's connections: the rows it changed.
    async fn execute(
        store: &Self::Store,
        stmt: &TokenStmt,
        args: TokenArgs<'_>,
    ) -> Result<u64, IdemError>;

    /// Flips the spent flag and, when nothing changed, reads the token, on one of the store's
    /// connections (`TokenConn::flip`).
    async fn flip(store: &Self::Store, args: TokenArgs<'_>) -> Result<Flip, IdemError>;
}

/// The token statements run on one connection (one of the store's: the backend's
/// [`TokenDb::execute`] and [`TokenDb::flip`] say which).
pub(crate) struct TokenConn<'c, DB: TokenDb>(pub(crate) &'c mut DB::Connection);

impl<DB: TokenDb> TokenConn<'_, DB>
where
    for<'e> &'e mut DB::Connection: Executor<'e, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'t> &'t str: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> bool: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'t> i64: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    for<'r> String: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    for<'r> bool: sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    for<'n> &'n str: sqlx::ColumnIndex<DB::Row>,
{
    /// `stmt` with the values it asks for bound.
    fn query(
        stmt: &TokenStmt,
        args: TokenArgs<'_>,
    ) -> sqlx::query::Query<'static, DB, DB::Arguments> {
        stmt.params
            .iter()
            .fold(sqlx::query(stmt.sql.clone()), |q, param| match param {
                TokenParam::Token => q.bind(args.token),
                TokenParam::Subject => q.bind(args.subject),
                TokenParam::Was => q.bind(!args.to),
                TokenParam::Becomes => q.bind(args.to),
                TokenParam::Offset => q.bind(args.offset),
                TokenParam::Ttl => q.bind(args.ttl),
                TokenParam::Batch => DB::bind_batch(q, args.batch),
            })
    }

    /// Runs `stmt`: the rows it changed.
    pub(crate) async fn execute(
        &mut self,
        stmt: &TokenStmt,
        args: TokenArgs<'_>,
    ) -> Result<u64, IdemError> {
        let done = Self::query(stmt, args)
            .execute(&mut *self.0)
            .await
            .map_err(DB::error)?;
        Ok(DB::rows_affected(&done))
    }

    /// The flip, then (when it changed nothing) the read of the token.
    pub(crate) async fn flip(
        &mut self,
        sql: &TokenStatements,
        args: TokenArgs<'_>,
    ) -> Result<Flip, IdemError> {
        if self.execute(&sql.flip, args).await? == 1 {
            return Ok(Flip::Done);
        }
        let row = Self::query(&sql.find, args)
            .fetch_optional(&mut *self.0)
            .await
            .map_err(DB::error)?;
        Ok(Flip::Refused(row.as_ref().map(DB::found).transpose()?))
    }
}

/// One-time submit tokens in a SQL store's database (the store's `tokens()`): an
/// `idem::PgTokens`, `idem::MySqlTokens` or `idem::SqliteTokens`. Run the store's `migrate()` first (it creates the
/// token table).
///
/// Consuming is one conditional flip of the spent flag (`UPDATE … SET spent = 1 WHERE token = ?
/// AND spent = 0 AND expire_at > now`): the row lock lets exactly one of N concurrent consumers
/// match.
pub struct SqlTokens<D: TokenDb> {
    store: D::Store,
}

impl<D: TokenDb> Clone for SqlTokens<D> {
    fn clone(&self) -> Self {
        SqlTokens {
            store: self.store.clone(),
        }
    }
}

impl<D: TokenDb> SqlTokens<D> {
    /// The tokens kept in `store`'s database.
    pub(crate) fn new(store: D::Store) -> Self {
        SqlTokens { store }
    }

    async fn flip(&self, token: &str, subject: Option<&str>, to: bool) -> Result<(), IdemError> {
        check_token(token)?;
        let subject = subject_of(subject)?;
        let args = TokenArgs {
            token,
            subject,
            to,
            offset: D::offset(&self.store),
            ..TokenArgs::default()
        };
        match D::flip(&self.store, args).await? {
            Flip::Done => Ok(()),
            Flip::Refused(found) => {
                let found = found.as_ref().map(|(subject, live)| Found {
                    subject,
                    live: *live,
                });
                Err(refusal(found, subject, to).error())
            }
        }
    }
}

#[async_trait]
impl<D: TokenDb> TokenStore for SqlTokens<D> {
    fn backend(&self) -> &'static str {
        D::BACKEND
    }

    async fn issue(&self, ttl: Duration, subject: Option<&str>) -> Result<String, IdemError> {
        check_ttl(ttl)?;
        let subject = subject_of(subject)?;
        let token = new_token()?;
        let args = TokenArgs {
            token: &token,
            subject,
            ttl: millis(ttl),
            offset: D::offset(&self.store),
            ..TokenArgs::default()
        };
        D::execute(&self.store, &D::statements(&self.store).issue, args).await?;
        Ok(token)
    }

    async fn consume(&self, token: &str, subject: Option<&str>) -> Result<(), IdemError> {
        self.flip(token, subject, true).await
    }

    async fn restore(&self, token: &str, subject: Option<&str>) -> Result<(), IdemError> {
        self.flip(token, subject, false).await
    }

    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        let args = TokenArgs {
            batch,
            offset: D::offset(&self.store),
            ..TokenArgs::default()
        };
        D::execute(&self.store, &D::statements(&self.store).sweep, args).await
    }
}
