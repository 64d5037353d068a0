//! One-time submit tokens in the Postgres store's database (table `idem_token`, or the name given
//! to `PgStoreBuilder::token_table`).

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Row, SqlSafeStr, SqlStr};

use super::{PgStore, db_error};
use crate::IdemError;
use crate::sql::dialect::Dialect;
use crate::sql::table::TableName;
use crate::store::decide::millis;
use crate::tokens::{Found, TokenStore, check_token, check_ttl, new_token, refusal, subject_of};

/// The database's clock in milliseconds plus the test clock's offset bound at `off`.
fn now_ms(off: &str) -> String {
    format!("(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT + {off})")
}

/// The token statements of one store, built once for its table name.
#[derive(Debug)]
pub(super) struct TokenStatements {
    issue: SqlStr,
    flip: SqlStr,
    find: SqlStr,
    sweep: SqlStr,
}

impl TokenStatements {
    pub(super) fn new(table: &TableName) -> Self {
        let t = table.quoted(Dialect::Postgres);
        let sql = |text: String| AssertSqlSafe(text).into_sql_str();
        TokenStatements {
            // $1 token, $2 subject, $3 ttl ms, $4 offset.
            issue: sql(format!(
                "INSERT INTO {t} (token, subject, spent, expire_at) VALUES ($1, $2, FALSE, {} + $3)",
                now_ms("$4")
            )),
            // $1 token, $2 subject, $3 the spent flag it must have, $4 the one it gets, $5 offset.
            // One conditional update: of N concurrent consumers exactly one changes the row (the
            // others wait for its row lock, then see the flag flipped and change nothing).
            flip: sql(format!(
                "UPDATE {t} SET spent = $4 WHERE token = $1 AND subject = $2 AND spent = $3 \
                 AND expire_at > {}",
                now_ms("$5")
            )),
            // $1 token, $2 offset.
            find: sql(format!(
                "SELECT subject, expire_at > {} AS live FROM {t} WHERE token = $1",
                now_ms("$2")
            )),
            // $1 batch, $2 offset.
            sweep: sql(format!(
                "DELETE FROM {t} WHERE token IN (SELECT token FROM {t} WHERE expire_at <= {} \
                 LIMIT $1 FOR UPDATE SKIP LOCKED)",
                now_ms("$2")
            )),
        }
    }
}

/// One-time submit tokens in a Postgres store's database ([`PgStore::tokens`]). Run the store's
/// `migrate()` first (it creates the tokens table).
#[derive(Clone)]
pub struct PgTokens {
    store: PgStore,
}

impl PgStore {
    /// The one-time submit tokens kept in this store's database (table `idem_token` by default).
    pub fn tokens(&self) -> PgTokens {
        PgTokens {
            store: self.clone(),
        }
    }
}

impl PgTokens {
    async fn flip(&self, token: &str, subject: Option<&str>, to: bool) -> Result<(), IdemError> {
        check_token(token)?;
        let subject = subject_of(subject)?;
        let offset = self.store.offset_ms();
        let sql = &self.store.token_sql;
        self.store
            .with_conn(async |conn| {
                let done = sqlx::query(sql.flip.clone())
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
                let row = sqlx::query(sql.find.clone())
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
impl TokenStore for PgTokens {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn issue(&self, ttl: Duration, subject: Option<&str>) -> Result<String, IdemError> {
        check_ttl(ttl)?;
        let subject = subject_of(subject)?;
        let token = new_token()?;
        let offset = self.store.offset_ms();
        let sql = self.store.token_sql.issue.clone();
        self.store
            .with_conn(async |conn| {
                sqlx::query(sql)
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
        let sql = self.store.token_sql.sweep.clone();
        self.store
            .with_conn(async |conn| {
                let done = sqlx::query(sql)
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
