//! One-time submit tokens in the MySQL store's database (table `idem_token`, or the store's
//! [`MySqlStore::with_token_table`]).

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;

use std::sync::Arc;

use super::statements::query;
use super::{MySqlStore, db_error};
use crate::IdemError;
use crate::sql::dialect::Dialect;
use crate::sql::table::TableName;
use crate::store::decide::millis;
use crate::tokens::{Found, TokenStore, check_token, check_ttl, new_token, refusal, subject_of};

/// One-time submit tokens in a MySQL store's database ([`MySqlStore::tokens`]). Run the store's
/// `migrate()` first (it creates the token table). Consuming is one conditional flip of the spent
/// flag (`UPDATE … SET spent = 1 WHERE token = ? AND spent = 0 AND expire_at > now`): InnoDB's row
/// lock lets exactly one of N concurrent consumers match.
#[derive(Clone)]
pub struct MySqlTokens {
    store: MySqlStore,
}

impl MySqlStore {
    /// The one-time submit tokens kept in this store's database.
    pub fn tokens(&self) -> MySqlTokens {
        MySqlTokens {
            store: self.clone(),
        }
    }
}

impl MySqlTokens {
    async fn flip(&self, token: &str, subject: Option<&str>, to: bool) -> Result<(), IdemError> {
        check_token(token)?;
        let subject = subject_of(subject)?;
        let (sql, off) = (&self.store.sql.tokens, self.store.offset_us());
        let mut conn = self.store.pool.acquire().await.map_err(db_error)?;
        let done = query(&sql.flip)
            .bind(to)
            .bind(token)
            .bind(subject)
            .bind(!to)
            .bind(off)
            .execute(&mut *conn)
            .await
            .map_err(db_error)?;
        if done.rows_affected() == 1 {
            return Ok(());
        }
        let row = query(&sql.find)
            .bind(off)
            .bind(token)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db_error)?;
        let found = match &row {
            Some(row) => Some((
                String::from_utf8(row.try_get::<Vec<u8>, _>("subject").map_err(db_error)?)
                    .map_err(IdemError::store)?,
                row.try_get::<i64, _>("live").map_err(db_error)? == 1,
            )),
            None => None,
        };
        let found = found.as_ref().map(|(subject, live)| Found {
            subject,
            live: *live,
        });
        Err(refusal(found, subject, to).error())
    }
}

#[async_trait]
impl TokenStore for MySqlTokens {
    fn backend(&self) -> &'static str {
        "mysql"
    }

    async fn issue(&self, ttl: Duration, subject: Option<&str>) -> Result<String, IdemError> {
        check_ttl(ttl)?;
        let subject = subject_of(subject)?;
        let token = new_token()?;
        query(&self.store.sql.tokens.issue)
            .bind(&token)
            .bind(subject)
            .bind(self.store.offset_us())
            .bind(millis(ttl))
            .execute(&self.store.pool)
            .await
            .map_err(db_error)?;
        Ok(token)
    }

    async fn consume(&self, token: &str, subject: Option<&str>) -> Result<(), IdemError> {
        self.flip(token, subject, true).await
    }

    async fn restore(&self, token: &str, subject: Option<&str>) -> Result<(), IdemError> {
        self.flip(token, subject, false).await
    }

    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        let done = query(&self.store.sql.tokens.sweep)
            .bind(self.store.offset_us())
            .bind(u64::try_from(batch).unwrap_or(u64::MAX))
            .execute(&self.store.pool)
            .await
            .map_err(db_error)?;
        Ok(done.rows_affected())
    }
}

/// The statements of the token table.
#[derive(Clone)]
pub(crate) struct TokenStatements {
    /// ?token ?subject ?off ?ttl
    pub issue: Arc<str>,
    /// ?to ?token ?subject ?from ?off
    pub flip: Arc<str>,
    /// ?off ?token
    pub find: Arc<str>,
    /// ?off ?batch
    pub sweep: Arc<str>,
}

impl TokenStatements {
    /// The statements of the token table `tokens`.
    pub(super) fn new(tokens: &TableName) -> Self {
        let tk = tokens.quoted(Dialect::MySQL);
        TokenStatements {
        issue: format!(
            "INSERT INTO {tk} (token, subject, spent, expire_at) VALUES (?, ?, 0, {now} + ?)",
            now = now_ms!()
        )
        .into(),
        flip: format!(
            "UPDATE {tk} SET spent = ? WHERE token = ? AND subject = ? AND spent = ? \
             AND expire_at > {now}",
            now = now_ms!()
        )
        .into(),
        find: format!(
            "SELECT subject, CAST(expire_at > {now} AS SIGNED) AS live FROM {tk} WHERE token = ?",
            now = now_ms!()
        )
        .into(),
        sweep: format!(
            "DELETE FROM {tk} WHERE expire_at <= {now} ORDER BY expire_at, token LIMIT ?",
            now = now_ms!()
        )
        .into(),
    }
    }
}
