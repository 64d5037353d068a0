//! The transaction-mode contract on `MySqlStore` (`MySqlTx` from `store.begin()`), with the
//! business's side effects in an InnoDB table of the same database; each test on tables of its own.

use crate::contract;

use std::sync::Arc;

use crate::contract::server;
use crate::contract::tx::TxBackend;
use idem::sqlx::{self, AssertSqlSafe};
use idem::{MySqlStore, MySqlTx, Store};

struct MySql {
    store: Arc<MySqlStore>,
    effects: String,
}

impl TxBackend for MySql {
    type Tx = MySqlTx;

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn begin(&self) -> MySqlTx {
        self.store.begin().await.unwrap()
    }

    async fn commit(tx: MySqlTx) {
        tx.commit().await.unwrap()
    }

    async fn rollback(tx: MySqlTx) {
        tx.rollback().await.unwrap()
    }

    async fn write_effect(tx: &mut MySqlTx, biz: &str, key: &str) -> i64 {
        let table = effects_table(tx.store());
        let id = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (biz, k) VALUES (?, ?)"
        )))
        .bind(biz)
        .bind(key)
        .execute(&mut **tx)
        .await
        .unwrap()
        .last_insert_id();
        i64::try_from(id).unwrap()
    }

    async fn effects(&self, biz: &str, key: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {} WHERE biz = ? AND k = ?",
            self.effects
        )))
        .bind(biz)
        .bind(key)
        .fetch_one(self.store.pool())
        .await
        .unwrap()
    }
}

/// The effects table that goes with a store's record table.
fn effects_table(store: &MySqlStore) -> String {
    format!("{}_fx", store.table())
}

async fn backend() -> Option<Arc<MySql>> {
    let url = server::mysql_url();
    let store = server::reach("MySQL", &url, MySqlStore::connect(&url)).await?;
    let store = store.with_table(&server::unique("idem_tx")).unwrap();
    store.migrate().await.unwrap();
    let effects = effects_table(&store);
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {effects} (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
         biz VARCHAR(64) NOT NULL, k VARCHAR(255) NOT NULL) ENGINE = InnoDB"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    Some(Arc::new(MySql {
        store: Arc::new(store),
        effects,
    }))
}

tx_contract_suite!(backend);
