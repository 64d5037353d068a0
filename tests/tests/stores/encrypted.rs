//! The store contract, lease and transaction mode, on `EncryptedStore` over `MemoryStore` and
//! over `SqliteStore`: sealing snapshots changes nothing a caller can observe.

use crate::contract;

use std::sync::Arc;

use crate::contract::tx::TxBackend;
use idem::sqlx::{self, Row};
use idem::{EncryptedStore, EncryptedTx, Keyring, MemoryStore, SqliteStore, Store, TestClock};

/// A keyring with a retired key, so every suite also runs with rotation in place.
fn keyring() -> Keyring {
    Keyring::new(2, [7u8; 32])
        .unwrap()
        .with_old(1, [9u8; 32])
        .unwrap()
}

async fn sqlite(clock: TestClock) -> SqliteStore {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("idem-encrypted-{}-{n}.db", std::process::id()));
    let store = SqliteStore::open(&path)
        .await
        .unwrap()
        .with_test_clock(clock);
    store.migrate().await.unwrap();
    sqlx::query(
        "CREATE TABLE effects (id INTEGER PRIMARY KEY, biz TEXT NOT NULL, k TEXT NOT NULL)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    store
}

mod memory {
    use super::*;

    async fn store(clock: TestClock) -> Option<Arc<dyn Store>> {
        let inner = MemoryStore::new().with_test_clock(clock);
        Some(Arc::new(EncryptedStore::new(inner, keyring())))
    }

    contract_suite!(store, burst = (200, 64));
}

mod sqlite {
    use super::*;

    async fn store(clock: TestClock) -> Option<Arc<dyn Store>> {
        Some(Arc::new(EncryptedStore::new(
            super::sqlite(clock).await,
            keyring(),
        )))
    }

    contract_suite!(store, burst = (200, 64));
}

struct Encrypted(EncryptedStore<SqliteStore>);

impl TxBackend for Encrypted {
    type Tx = EncryptedTx<SqliteStore>;

    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.0.clone())
    }

    async fn begin(&self) -> Self::Tx {
        self.0.begin().await.unwrap()
    }

    async fn commit(tx: Self::Tx) {
        tx.commit().await.unwrap()
    }

    async fn rollback(tx: Self::Tx) {
        tx.rollback().await.unwrap()
    }

    async fn write_effect(tx: &mut Self::Tx, biz: &str, key: &str) -> i64 {
        sqlx::query("INSERT INTO effects (biz, k) VALUES (?1, ?2)")
            .bind(biz)
            .bind(key)
            .execute(tx.conn())
            .await
            .unwrap()
            .last_insert_rowid()
    }

    async fn effects(&self, biz: &str, key: &str) -> i64 {
        sqlx::query("SELECT COUNT(*) FROM effects WHERE biz = ?1 AND k = ?2")
            .bind(biz)
            .bind(key)
            .fetch_one(self.0.inner().pool())
            .await
            .unwrap()
            .get(0)
    }
}

async fn backend() -> Option<Arc<Encrypted>> {
    let store = sqlite(TestClock::new()).await;
    Some(Arc::new(Encrypted(EncryptedStore::new(store, keyring()))))
}

mod tx {
    use super::*;
    tx_contract_suite!(backend);
}
