//! The order table of a handler behind the Idempotency-Key layer in transaction mode: each SQL
//! store's transaction type writes a row through the layer's transaction (`tests/http_tx.rs`,
//! `tests/crash.rs`). Include it with `#[path = "support/tx_orders.rs"] mod tx_orders;`.

#![allow(dead_code)]

use idem::IdemError;
use idem::sqlx::{self, AssertSqlSafe};

/// A transaction a handler writes its order in.
pub trait Orders: Send + Sync + 'static {
    /// Inserts the order `(k, who)` into `table`, a table `(k, who)` in the store's database.
    fn insert_order(
        &mut self,
        table: &str,
        key: &str,
        who: &str,
    ) -> impl Future<Output = Result<(), IdemError>> + Send;
}

impl Orders for idem::SqliteTx {
    async fn insert_order(&mut self, table: &str, key: &str, who: &str) -> Result<(), IdemError> {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (k, who) VALUES (?, ?)"
        )))
        .bind(key)
        .bind(who)
        .execute(&mut **self)
        .await
        .map(drop)
        .map_err(IdemError::store)
    }
}

#[cfg(feature = "encrypt")]
impl Orders for idem::EncryptedTx<idem::SqliteStore> {
    async fn insert_order(&mut self, table: &str, key: &str, who: &str) -> Result<(), IdemError> {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (k, who) VALUES (?, ?)"
        )))
        .bind(key)
        .bind(who)
        .execute(&mut **self)
        .await
        .map(drop)
        .map_err(IdemError::store)
    }
}

#[cfg(feature = "mysql")]
impl Orders for idem::MySqlTx {
    async fn insert_order(&mut self, table: &str, key: &str, who: &str) -> Result<(), IdemError> {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (k, who) VALUES (?, ?)"
        )))
        .bind(key)
        .bind(who)
        .execute(&mut **self)
        .await
        .map(drop)
        .map_err(IdemError::store)
    }
}

#[cfg(feature = "postgres")]
impl Orders for idem::PgTx {
    async fn insert_order(&mut self, table: &str, key: &str, who: &str) -> Result<(), IdemError> {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (k, who) VALUES ($1, $2)"
        )))
        .bind(key)
        .bind(who)
        .execute(&mut **self)
        .await
        .map(drop)
        .map_err(IdemError::store)
    }
}

/// The DDL of an order table named `table`.
pub fn create_table(table: &str) -> String {
    format!("CREATE TABLE {table} (k VARCHAR(255) NOT NULL, who VARCHAR(64) NOT NULL)")
}
