//! One-time submit tokens in the SQLite store's database (table `idem_token` unless
//! [`SqliteStore::with_token_table`] names another).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;

use super::statements::query;
use super::{SqliteStore, db_error};
use crate::IdemError;
use crate::sql::dialect::Dialect;
use crate::sql::table::TableName;
use crate::store::decide::millis;
use crate::tokens::{Found, TokenStore, check_token, check_ttl, new_token, refusal, subject_of};

/// The database's clock in milliseconds plus the test clock's offset, bound at `$offset`.
macro_rules! now_ms {
    ($offset:literal) => {
        concat!(
            "(CAST(unixepoch('subsec') * 1000 AS INTEGER) + ",
            $offset,
            ")"
        )
    };
}

/// ?1 token, ?2 subject, ?3 ttl ms, ?4 offset.
const ISSUE: &str = concat!(
    "INSERT INTO {tk} (token, subject, spent, expire_at) VALUES (?1, ?2, 0, ",
    now_ms!("?4"),
    " + ?3)"
);
/// ?1 token, ?2 subject, ?3 the spent flag it must have, ?4 the one it gets, ?5 offset.
const FLIP: &str = concat!(
    "UPDATE {tk} SET spent = ?4 WHERE token = ?1 AND subject = ?2 AND spent = ?3 AND expire_at > ",
    now_ms!("?5")
);
/// ?1 token, ?2 offset.
const FIND: &str = concat!(
    "SELECT subject, expire_at > ",
    now_ms!("?2"),
    " AS live FROM {tk} WHERE token = ?1"
);
/// ?1 batch, ?2 offset.
const SWEEP: &str = concat!(
    "DELETE FROM {tk} WHERE token IN (SELECT token FROM {tk} WHERE expire_at <= ",
    now_ms!("?2"),
    " LIMIT ?1)"
);

/// The token statements for one table: the templates above with its quoted name in place of
/// `{tk}`.
#[derive(Debug)]
pub(super) struct TokenStatements {
    issue: Arc<str>,
    flip: Arc<str>,
    find: Arc<str>,
    sweep: Arc<str>,
}

impl TokenStatements {
    pub(super) fn new(table: &TableName) -> Self {
        let tk = table.quoted(Dialect::SQLite);
        let named = |template: &str| -> Arc<str> { template.replace("{tk}", &tk).into() };
        TokenStatements {
            issue: named(ISSUE),
            flip: named(FLIP),
            find: named(FIND),
            sweep: named(SWEEP),
        }
    }
}

/// One-time submit tokens in an SQLite store's database ([`SqliteStore::tokens`]). Run the
/// store's `migrate()` first (it creates the token table).
#[derive(Clone)]
pub struct SqliteTokens {
    store: SqliteStore,
}

impl SqliteStore {
    /// The one-time submit tokens kept in this store's database (its token table, `idem_token`
    /// unless [`SqliteStore::with_token_table`] names another).
    pub fn tokens(&self) -> SqliteTokens {
        SqliteTokens {
            store: self.clone(),
        }
    }
}

impl SqliteTokens {
    async fn flip(&self, token: &str, subject: Option<&str>, to: bool) -> Result<(), IdemError> {
        check_token(token)?;
        let subject = subject_of(subject)?;
        let offset = self.store.offset_ms();
        self.store
            .with_conn(async |conn| {
                let done = query(&self.store.token_sql.flip)
                    .bind(token)
                    .bind(subject)
                    .bind(!to)
                    .bind(to)
                    .bind(offset)
                    .execute(&mut *conn)
                    .await
                    .map_err(db_error)?;
                if done.rows_affected() == 1 {
                    return Ok(());
                }
                let row = query(&self.store.token_sql.find)
                    .bind(token)
                    .bind(offset)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(db_error)?;
                let found = match &row {
                    Some(row) => Some((
                        row.try_get::<String, _>("subject").map_err(db_error)?,
                        row.try_get::<bool, _>("live").map_err(db_error)?,
                    )),
                    None => None,
                };
                let found = found.as_ref().map(|(subject, live)| Found {
                    subject,
                    live: *live,
                });
                Err(refusal(found, subject, to).error())
            })
            .await
    }
}

#[async_trait]
impl TokenStore for SqliteTokens {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn issue(&self, ttl: Duration, subject: Option<&str>) -> Result<String, IdemError> {
        check_ttl(ttl)?;
        let subject = subject_of(subject)?;
        let token = new_token()?;
        let offset = self.store.offset_ms();
        self.store
            .with_conn(async |conn| {
                query(&self.store.token_sql.issue)
                    .bind(&token)
                    .bind(subject)
                    .bind(millis(ttl))
                    .bind(offset)
                    .execute(conn)
                    .await
                    .map_err(db_error)
            })
            .await?;
        Ok(token)
    }

    async fn consume(&self, token: &str, subject: Option<&str>) -> Result<(), IdemError> {
        self.flip(token, subject, true).await
    }

    async fn restore(&self, token: &str, subject: Option<&str>) -> Result<(), IdemError> {
        self.flip(token, subject, false).await
    }

    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        let offset = self.store.offset_ms();
        self.store
            .with_conn(async |conn| {
                let done = query(&self.store.token_sql.sweep)
                    .bind(i64::try_from(batch).unwrap_or(i64::MAX))
                    .bind(offset)
                    .execute(conn)
                    .await
                    .map_err(db_error)?;
                Ok(done.rows_affected())
            })
            .await
    }
}
