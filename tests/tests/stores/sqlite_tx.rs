//! The transaction-mode contract on `SqliteStore` (`SqliteTx` from `store.begin()`), with the
//! business's side effects in a table of the same database file.

use crate::contract;

use std::sync::Arc;

use crate::contract::tx::TxBackend;
use idem::sqlx::{self, Row};
use idem::{SqliteStore, SqliteTx, Store};

struct Sqlite(Arc<SqliteStore>);

impl TxBackend for Sqlite {
    type Tx = SqliteTx;

    fn store(&self) -> Arc<dyn Store> {
        self.0.clone()
    }

    async fn begin(&self) -> SqliteTx {
        self.0.begin().await.unwrap()
    }

    async fn commit(tx: SqliteTx) {
        tx.commit().await.unwrap()
    }

    async fn rollback(tx: SqliteTx) {
        tx.rollback().await.unwrap()
    }

    async fn write_effect(tx: &mut SqliteTx, biz: &str, key: &str) -> i64 {
        sqlx::query("INSERT INTO effects (biz, k) VALUES (?1, ?2)")
            .bind(biz)
            .bind(key)
            .execute(&mut **tx)
            .await
            .unwrap()
            .last_insert_rowid()
    }

    async fn effects(&self, biz: &str, key: &str) -> i64 {
        sqlx::query("SELECT COUNT(*) FROM effects WHERE biz = ?1 AND k = ?2")
            .bind(biz)
            .bind(key)
            .fetch_one(self.0.pool())
            .await
            .unwrap()
            .get(0)
    }
}

async fn backend() -> Option<Arc<Sqlite>> {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("idem-tx-contract-{}-{n}.db", std::process::id()));
    let store = SqliteStore::open(&path).await.unwrap();
    store.migrate().await.unwrap();
    sqlx::query(
        "CREATE TABLE effects (id INTEGER PRIMARY KEY, biz TEXT NOT NULL, k TEXT NOT NULL)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    Some(Arc::new(Sqlite(Arc::new(store))))
}

tx_contract_suite!(backend);
