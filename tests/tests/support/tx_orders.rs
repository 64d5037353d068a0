//! The order table of a handler behind the Idempotency-Key layer in transaction mode: each SQL
//! store's transaction type writes a row through the layer's transaction (`tests/http_tx.rs`,
//! `tests/crash/`). Include it with `#[path = "support/tx_orders.rs"] mod tx_orders;`.

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

/// `Orders` for a transaction type whose driver writes its two placeholders `$p1`, `$p2`.
macro_rules! orders {
    ($(#[$cfg:meta])* $tx:ty, $p1:literal, $p2:literal) => {
        $(#[$cfg])*
        impl Orders for $tx {
            async fn insert_order(
                &mut self,
                table: &str,
                key: &str,
                who: &str,
            ) -> Result<(), IdemError> {
                let insert = format!("INSERT INTO {table} (k, who) VALUES ({}, {})", $p1, $p2);
                sqlx::query(AssertSqlSafe(insert))
                    .bind(key)
                    .bind(who)
                    .execute(self.conn())
                    .await
                    .map(drop)
                    .map_err(IdemError::store)
            }
        }
    };
}

orders!(idem::SqliteTx, "?", "?");
orders!(#[cfg(feature = "encrypt")] idem::EncryptedTx<idem::SqliteStore>, "?", "?");
orders!(
    #[cfg(feature = "mysql")]
    idem::MySqlTx,
    "?",
    "?"
);
orders!(
    #[cfg(feature = "postgres")]
    idem::PgTx,
    "$1",
    "$2"
);

/// The DDL of an order table named `table`.
pub fn create_table(table: &str) -> String {
    format!("CREATE TABLE {table} (k VARCHAR(255) NOT NULL, who VARCHAR(64) NOT NULL)")
}
