//! One-time submit tokens in the MySQL store's database (table `idem_token`, or the store's
//! [`MySqlStore::with_token_table`]): the statements' text and the connection they run on; the
//! rest is `sql/tokens.rs`'s.

use async_trait::async_trait;
use sqlx::mysql::MySqlArguments;
use sqlx::{MySql, Row};

use super::{MySqlStore, db_error};
use crate::IdemError;
use crate::sql::dialect::Dialect;
use crate::sql::table::TableName;
use crate::sql::tokens::{
    Flip, SqlTokens, TokenArgs, TokenConn, TokenDb, TokenParam::*, TokenStatements, TokenStmt,
};

/// One-time submit tokens in a MySQL store's database ([`MySqlStore::tokens`]). Run the store's
/// `migrate()` first (it creates the token table). Consuming is one conditional flip of the spent
/// flag (`UPDATE … SET spent = 1 WHERE token = ? AND spent = 0 AND expire_at > now`): InnoDB's row
/// lock lets exactly one of N concurrent consumers match.
pub type MySqlTokens = SqlTokens<MySql>;

impl MySqlStore {
    /// The one-time submit tokens kept in this store's database.
    pub fn tokens(&self) -> MySqlTokens {
        SqlTokens::new(self.clone())
    }
}

/// The statements of the token table `tokens`.
pub(super) fn token_statements(tokens: &TableName) -> TokenStatements {
    let tk = tokens.quoted(Dialect::MySQL);
    TokenStatements {
        issue: TokenStmt::new(
            format!(
                "INSERT INTO {tk} (token, subject, spent, expire_at) VALUES (?, ?, 0, {now} + ?)",
                now = now_ms!()
            ),
            &[Token, Subject, Offset, Ttl],
        ),
        flip: TokenStmt::new(
            format!(
                "UPDATE {tk} SET spent = ? WHERE token = ? AND subject = ? AND spent = ? \
                 AND expire_at > {now}",
                now = now_ms!()
            ),
            &[Becomes, Token, Subject, Was, Offset],
        ),
        find: TokenStmt::new(
            format!(
                "SELECT subject, CAST(expire_at > {now} AS SIGNED) AS live FROM {tk} WHERE token = ?",
                now = now_ms!()
            ),
            &[Offset, Token],
        ),
        sweep: TokenStmt::new(
            format!(
                "DELETE FROM {tk} WHERE expire_at <= {now} ORDER BY expire_at, token LIMIT ?",
                now = now_ms!()
            ),
            &[Offset, Batch],
        ),
    }
}

#[async_trait]
impl TokenDb for MySql {
    type Store = MySqlStore;
    const BACKEND: &'static str = "mysql";

    fn statements(store: &MySqlStore) -> &TokenStatements {
        &store.sql.tokens
    }

    fn offset(store: &MySqlStore) -> i64 {
        store.offset_us()
    }

    fn bind_batch(
        query: sqlx::query::Query<'static, MySql, MySqlArguments>,
        batch: usize,
    ) -> sqlx::query::Query<'static, MySql, MySqlArguments> {
        query.bind(u64::try_from(batch).unwrap_or(u64::MAX))
    }

    fn found(row: &sqlx::mysql::MySqlRow) -> Result<(String, bool), IdemError> {
        Ok((
            String::from_utf8(row.try_get::<Vec<u8>, _>("subject").map_err(db_error)?)
                .map_err(IdemError::store)?,
            row.try_get::<i64, _>("live").map_err(db_error)? == 1,
        ))
    }

    async fn execute(
        store: &MySqlStore,
        stmt: &TokenStmt,
        args: TokenArgs<'_>,
    ) -> Result<u64, IdemError> {
        let mut conn = store.pool.acquire().await.map_err(db_error)?;
        TokenConn::<MySql>(&mut conn).execute(stmt, args).await
    }

    async fn flip(store: &MySqlStore, args: TokenArgs<'_>) -> Result<Flip, IdemError> {
        let mut conn = store.pool.acquire().await.map_err(db_error)?;
        TokenConn::<MySql>(&mut conn)
            .flip(&store.sql.tokens, args)
            .await
    }
}
