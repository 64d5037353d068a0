//! One-time submit tokens in the Postgres store's database (table `idem_token`, or the name given
//! to `PgStoreBuilder::token_table`): the statements' text and the connection they run on; the
//! rest is `sql/tokens.rs`'s.

use async_trait::async_trait;
use sqlx::Postgres;

use super::PgStore;
use crate::IdemError;
use crate::sql::dialect::Dialect;
use crate::sql::store::with_conn;
use crate::sql::table::TableName;
use crate::sql::tokens::{
    Flip, SqlTokens, TokenArgs, TokenConn, TokenDb, TokenParam::*, TokenStatements, TokenStmt,
};

/// The database's clock in milliseconds plus the test clock's offset bound at `off`.
fn now_ms(off: &str) -> String {
    format!("(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT + {off})")
}

/// The token statements of one store, built once for its table name.
pub(super) fn token_statements(table: &TableName) -> TokenStatements {
    let t = table.quoted(Dialect::Postgres);
    TokenStatements {
        // $1 token, $2 subject, $3 ttl ms, $4 offset.
        issue: TokenStmt::new(
            format!(
                "INSERT INTO {t} (token, subject, spent, expire_at) VALUES ($1, $2, FALSE, {} + $3)",
                now_ms("$4")
            ),
            &[Token, Subject, Ttl, Offset],
        ),
        // $1 token, $2 subject, $3 the spent flag it must have, $4 the one it gets, $5 offset.
        // One conditional update: of N concurrent consumers exactly one changes the row (the
        // others wait for its row lock, then see the flag flipped and change nothing).
        flip: TokenStmt::new(
            format!(
                "UPDATE {t} SET spent = $4 WHERE token = $1 AND subject = $2 AND spent = $3 \
                 AND expire_at > {}",
                now_ms("$5")
            ),
            &[Token, Subject, Was, Becomes, Offset],
        ),
        // $1 token, $2 offset.
        find: TokenStmt::new(
            format!(
                "SELECT subject, expire_at > {} AS live FROM {t} WHERE token = $1",
                now_ms("$2")
            ),
            &[Token, Offset],
        ),
        // $1 batch, $2 offset.
        sweep: TokenStmt::new(
            format!(
                "DELETE FROM {t} WHERE token IN (SELECT token FROM {t} WHERE expire_at <= {} \
                 LIMIT $1 FOR UPDATE SKIP LOCKED)",
                now_ms("$2")
            ),
            &[Batch, Offset],
        ),
    }
}

/// One-time submit tokens in a Postgres store's database ([`PgStore::tokens`]). Run the store's
/// `migrate()` first (it creates the tokens table).
pub type PgTokens = SqlTokens<Postgres>;

impl PgStore {
    /// The one-time submit tokens kept in this store's database (table `idem_token` by default).
    pub fn tokens(&self) -> PgTokens {
        SqlTokens::new(self.clone())
    }
}

#[async_trait]
impl TokenDb for Postgres {
    type Store = PgStore;
    const BACKEND: &'static str = "postgres";

    fn statements(store: &PgStore) -> &TokenStatements {
        &store.token_sql
    }

    fn offset(store: &PgStore) -> i64 {
        store.offset_ms()
    }

    async fn execute(
        store: &PgStore,
        stmt: &TokenStmt,
        args: TokenArgs<'_>,
    ) -> Result<u64, IdemError> {
        with_conn(store, async |conn| {
            TokenConn::<Postgres>(conn).execute(stmt, args).await
        })
        .await
    }

    async fn flip(store: &PgStore, args: TokenArgs<'_>) -> Result<Flip, IdemError> {
        let sql = &store.token_sql;
        with_conn(store, async |conn| {
            TokenConn::<Postgres>(conn).flip(sql, args).await
        })
        .await
    }
}
