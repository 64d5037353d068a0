//! The store contract, lease and transaction mode, on `EncryptedStore<PgStore>` against the local
//! Postgres (`IDEM_PG_URL`, default `postgres://postgres@127.0.0.1:5432/test`; one skip line when it
//! is unreachable, unless `IDEM_REQUIRE_SERVICES=1`): sealed snapshots in a `BYTEA` column.

use crate::contract;
use crate::pg;

use std::sync::Arc;

use crate::contract::tx::TxBackend;
use idem::sqlx::{self, AssertSqlSafe};
use idem::{EncryptedStore, EncryptedTx, Keyring, PgStore, Store};

fn keyring() -> Keyring {
    Keyring::new(2, [7u8; 32])
        .unwrap()
        .with_old(1, [9u8; 32])
        .unwrap()
}

async fn store(clock: idem::TestClock) -> Option<Arc<dyn Store>> {
    let store = pg::store(16).await?.with_test_clock(clock);
    Some(Arc::new(EncryptedStore::new(store, keyring())))
}

contract_suite!(store, burst = (200, 64));

struct Postgres {
    store: EncryptedStore<PgStore>,
    /// `SELECT COUNT(*) FROM <effects> …`
    count: String,
}

impl TxBackend for Postgres {
    type Tx = EncryptedTx<PgStore>;

    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }

    async fn begin(&self) -> Self::Tx {
        self.store.begin().await.unwrap()
    }

    async fn commit(tx: Self::Tx) {
        tx.commit().await.unwrap()
    }

    async fn rollback(tx: Self::Tx) {
        tx.rollback().await.unwrap()
    }

    async fn write_effect(tx: &mut Self::Tx, biz: &str, key: &str) -> i64 {
        let effects = format!("{}_fx", tx.inner_mut().store().table());
        sqlx::query_scalar(AssertSqlSafe(format!(
            "INSERT INTO {effects} (biz, k) VALUES ($1, $2) RETURNING id"
        )))
        .bind(biz)
        .bind(key)
        .fetch_one(tx.conn())
        .await
        .unwrap()
    }

    async fn effects(&self, biz: &str, key: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(self.count.clone()))
            .bind(biz)
            .bind(key)
            .fetch_one(self.store.inner().pool())
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
        store: EncryptedStore::new(store, keyring()),
    }))
}

mod tx {
    use super::*;
    tx_contract_suite!(backend);
}
