//! The store contract, lease and transaction mode, on a `ShardedStore` over four SQLite files; and
//! the rule that a transaction joins only calls whose key lives on its shard.

use crate::contract;

use std::sync::Arc;

use crate::contract::tx::TxBackend;
use idem::sqlx::{self, Row};
use idem::{Call, IdemError, IdemKey, ShardedStore, ShardedTx, SqliteStore, Store, TestClock};

const SHARDS: usize = 4;

/// Four fresh SQLite files, each with an `effects` table for the business writes of the tx suite.
async fn shards(clock: TestClock) -> Vec<SqliteStore> {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("idem-sharded-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut shards = Vec::new();
    for i in 0..SHARDS {
        let store = SqliteStore::open(dir.join(format!("shard{i}.db")))
            .await
            .unwrap()
            .with_test_clock(clock.clone());
        store.migrate().await.unwrap();
        sqlx::query(
            "CREATE TABLE effects (id INTEGER PRIMARY KEY, biz TEXT NOT NULL, k TEXT NOT NULL)",
        )
        .execute(store.pool())
        .await
        .unwrap();
        shards.push(store);
    }
    shards
}

async fn store(clock: TestClock) -> Option<Arc<dyn Store>> {
    Some(Arc::new(ShardedStore::new(shards(clock).await).unwrap()))
}

contract_suite!(store, burst = (200, 64));

struct Sharded(ShardedStore<SqliteStore>);

impl TxBackend for Sharded {
    type Tx = ShardedTx<SqliteStore>;

    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.0.clone())
    }

    async fn begin(&self) -> Self::Tx {
        self.0.begin_for("", "any").await.unwrap()
    }

    async fn begin_for(&self, biz: &str, key: &str) -> Self::Tx {
        self.0.begin_for(biz, key).await.unwrap()
    }

    fn keys_in_one_transaction(&self, biz: &str, n: usize) -> Vec<String> {
        contract::tx::keys_of_one_shard(|key| self.0.shard_index(biz, key), n)
    }

    async fn commit(tx: Self::Tx) {
        tx.into_inner().commit().await.unwrap()
    }

    async fn rollback(tx: Self::Tx) {
        tx.into_inner().rollback().await.unwrap()
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
        let mut total = 0;
        for shard in self.0.shards() {
            let n: i64 = sqlx::query("SELECT COUNT(*) FROM effects WHERE biz = ?1 AND k = ?2")
                .bind(biz)
                .bind(key)
                .fetch_one(shard.pool())
                .await
                .unwrap()
                .get(0);
            total += n;
        }
        total
    }
}

async fn backend() -> Option<Arc<Sharded>> {
    Some(Arc::new(Sharded(
        ShardedStore::new(shards(TestClock::new()).await).unwrap(),
    )))
}

mod tx {
    use super::*;
    tx_contract_suite!(backend);
}

/// Keys spread over every shard, each record on the shard the routing names and nowhere else.
#[tokio::test]
async fn records_spread_over_the_shards_by_key() {
    let store = ShardedStore::new(shards(TestClock::new()).await).unwrap();
    let mut used = [0usize; SHARDS];
    for k in 0..200 {
        let key = format!("order-{k}");
        let n: Result<u32, IdemError> =
            Call::new("SPREAD", &key).run(&store, async { Ok(k) }).await;
        assert_eq!(n.unwrap(), k);
        let home = store.shard_index("SPREAD", &key);
        used[home] += 1;
        for (i, shard) in store.shards().iter().enumerate() {
            assert_eq!(
                shard.load("SPREAD", &key).await.unwrap().is_some(),
                i == home,
                "{key} on shard {i}"
            );
        }
    }
    assert!(
        used.iter().all(|n| *n > 20),
        "every shard holds keys: {used:?}"
    );
}

/// A transaction begun for one key cannot claim a key of another shard: refused before anything is
/// written, so the claim can never land where lease-mode calls would not look.
#[tokio::test]
async fn a_transaction_joins_only_calls_of_its_shard() {
    let store = ShardedStore::new(shards(TestClock::new()).await).unwrap();
    let mine = "order-1";
    let other = (0..)
        .map(|i| format!("order-{i}"))
        .find(|k| store.shard_index("TX", k) != store.shard_index("TX", mine))
        .unwrap();
    let mut tx = store.begin_for("TX", &mine.to_key()).await.unwrap();
    let refused: Result<u8, IdemError> = Call::new("TX", &other)
        .run_in_tx(&mut tx, async |_tx| Ok(1))
        .await;
    match refused {
        Err(IdemError::InvalidOptions { reason }) => {
            assert!(reason.contains("begin_for"), "{reason}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let fine: Result<u8, IdemError> = Call::new("TX", mine)
        .run_in_tx(&mut tx, async |_tx| Ok(2))
        .await;
    assert_eq!(fine.unwrap(), 2);
    tx.into_inner().commit().await.unwrap();
    for shard in store.shards() {
        assert!(
            shard.load("TX", &other).await.unwrap().is_none(),
            "nothing written for the refused key"
        );
    }
    assert!(store.load("TX", mine).await.unwrap().is_some());
}

#[idem::idempotent(biz = "SHPAY", key = "order_no", tx = "tx")]
async fn pay(tx: &mut ShardedTx<SqliteStore>, order_no: &str) -> Result<i64, IdemError> {
    let row = sqlx::query("INSERT INTO effects (biz, k) VALUES ('SHPAY', ?1)")
        .bind(order_no)
        .execute(tx.conn())
        .await
        .map_err(IdemError::store)?
        .last_insert_rowid();
    Ok(row)
}

/// Through the attribute: the transaction from `begin_for(biz, key)` is what `tx` names.
#[tokio::test]
async fn the_attribute_joins_a_sharded_transaction() {
    let store = ShardedStore::new(shards(TestClock::new()).await).unwrap();
    let mut tx = store.begin_for("SHPAY", "O-9").await.unwrap();
    let first = pay(&mut tx, "O-9").await.unwrap();
    tx.into_inner().commit().await.unwrap();
    let mut tx = store.begin_for("SHPAY", "O-9").await.unwrap();
    assert_eq!(pay(&mut tx, "O-9").await.unwrap(), first, "replayed");
    tx.into_inner().commit().await.unwrap();
}

/// `with_limits` on a sharded store narrows within the strictest shard's limits (a record may land
/// on any shard): a narrower limit is enforced on every key, one past a shard's is refused.
#[tokio::test]
async fn with_limits_stays_within_every_shard() {
    let mut shards = shards(TestClock::new()).await;
    shards[2] = shards[2]
        .clone()
        .with_limits(idem::store::Limits {
            max_key_len: 40,
            ..idem::store::Limits::default()
        })
        .unwrap();
    let store = ShardedStore::new(shards).unwrap();
    assert_eq!(store.limits().max_key_len, 40, "the strictest shard's");
    let err = store
        .clone()
        .with_limits(idem::store::Limits {
            max_key_len: 41,
            ..idem::store::Limits::default()
        })
        .err()
        .unwrap();
    assert!(
        matches!(err, IdemError::InvalidOptions { .. })
            && err.to_string().contains("max_key_len = 41")
            && err.to_string().contains("at most 40"),
        "{err}"
    );
    let narrow = store
        .with_limits(idem::store::Limits {
            max_key_len: 4,
            ..idem::store::Limits::default()
        })
        .unwrap();
    let over: Result<u8, IdemError> = Call::new("PAY", "12345")
        .run(&narrow, async { Ok(1) })
        .await;
    assert!(
        matches!(over, Err(IdemError::InvalidKey { .. })),
        "{over:?}"
    );
    let ok: Result<u8, IdemError> = Call::new("PAY", "1234").run(&narrow, async { Ok(1) }).await;
    assert_eq!(ok.unwrap(), 1);
}
