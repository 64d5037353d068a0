//! One-time submit tokens in the SQLite store's database (table `idem_token` unless
//! [`SqliteStore::with_token_table`] names another): the statements' text and the connection they
//! run on; the rest is `sql/tokens.rs`'s.

use async_trait::async_trait;
use sqlx::Sqlite;

use super::SqliteStore;
use crate::IdemError;
use crate::sql::dialect::Dialect;
use crate::sql::store::with_conn;
use crate::sql::table::TableName;
use crate::sql::tokens::{
    Flip, SqlTokens, TokenArgs, TokenConn, TokenDb, TokenParam::*, TokenStatements, TokenStmt,
};

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
pub(super) fn token_statements(table: &TableName) -> TokenStatements {
    let tk = table.quoted(Dialect::SQLite);
    let named = |template: &str| template.replace("{tk}", &tk);
    TokenStatements {
        issue: TokenStmt::new(named(ISSUE), &[Token, Subject, Ttl, Offset]),
        flip: TokenStmt::new(named(FLIP), &[Token, Subject, Was, Becomes, Offset]),
        find: TokenStmt::new(named(FIND), &[Token, Offset]),
        sweep: TokenStmt::new(named(SWEEP), &[Batch, Offset]),
    }
}

/// One-time submit tokens in an SQLite store's database ([`SqliteStore::tokens`]). Run the
/// store's `migrate()` first (it creates the token table).
pub type SqliteTokens = SqlTokens<Sqlite>;

impl SqliteStore {
    /// The one-time submit tokens kept in this store's database (its token table, `idem_token`
    /// unless [`SqliteStore::with_token_table`] names another).
    pub fn tokens(&self) -> SqliteTokens {
        SqlTokens::new(self.clone())
    }
}

#[async_trait]
impl TokenDb for Sqlite {
    type Store = SqliteStore;
    const BACKEND: &'static str = "sqlite";

    fn statements(store: &SqliteStore) -> &TokenStatements {
        &store.token_sql
    }

    fn offset(store: &SqliteStore) -> i64 {
        store.offset_ms()
    }

    async fn execute(
        store: &SqliteStore,
        stmt: &TokenStmt,
        args: TokenArgs<'_>,
    ) -> Result<u64, IdemError> {
        with_conn(store, async |conn| {
            TokenConn::<Sqlite>(conn).execute(stmt, args).await
        })
        .await
    }

    async fn flip(store: &SqliteStore, args: TokenArgs<'_>) -> Result<Flip, IdemError> {
        let sql = &store.token_sql;
        with_conn(store, async |conn| {
            TokenConn::<Sqlite>(conn).flip(sql, args).await
        })
        .await
    }
}
