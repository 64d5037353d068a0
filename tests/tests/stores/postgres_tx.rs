//! The transaction-mode contract on `PgStore` (`PgTx` from `store.begin()`), with the business's
//! side effects in a table of the same database.

use crate::contract;
use crate::pg;

use std::sync::Arc;

use crate::contract::tx::TxBackend;
use idem::sqlx::{self, AssertSqlSafe};
use idem::{PgStore, PgTx, Store};

struct Postgres {
    store: Arc<PgStore>,
    /// `SELECT COUNT(*) FROM <effects> …`
    count: String,
}

impl TxBackend for Postgres {
    type Tx = PgTx;

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn begin(&self) -> PgTx {
        self.store.begin().await.unwrap()
    }

    async fn commit(tx: PgTx) {
        tx.commit().await.unwrap()
    }

    async fn rollback(tx: PgTx) {
        tx.rollback().await.unwrap()
    }

    async fn write_effect(tx: &mut PgTx, biz: &str, key: &str) -> i64 {
        // The statement's text names this backend's table: fetch it from the store's table name.
        let effects = format!("{}_fx", tx.store().table());
        sqlx::query_scalar(AssertSqlSafe(format!(
            "INSERT INTO {effects} (biz, k) VALUES ($1, $2) RETURNING id"
        )))
        .bind(biz)
        .bind(key)
        .fetch_one(&mut **tx)
        .await
        .unwrap()
    }

    async fn effects(&self, biz: &str, key: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(self.count.clone()))
            .bind(biz)
            .bind(key)
            .fetch_one(self.store.pool())
            .await
            .unwrap()
    }
}

async fn backend() -> Option<Arc<Postgres>> {
    let store = pg::store(24).await?;
    let effects = format!("{}_fx", store.table());
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {effects} (id BIGSERIAL PRIMARY KEY, biz TEXT NOT NULL, k TEXT NOT NULL)"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    Some(Arc::new(Postgres {
        count: format!("SELECT COUNT(*) FROM {effects} WHERE biz = $1 AND k = $2"),
        store: Arc::new(store),
    }))
}

tx_contract_suite!(backend);
