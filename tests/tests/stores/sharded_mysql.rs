//! The store contract, lease and transaction mode, on a `ShardedStore` over four MariaDB / MySQL
//! databases (`test_idem_shard_0` … `test_idem_shard_3` on the server of `IDEM_MYSQL_URL`, made if
//! missing); each test on tables of its own.

use crate::contract;
use crate::leftovers;

use std::sync::Arc;
use std::time::Duration;

use crate::contract::server;
use crate::contract::tx::TxBackend;
use idem::sqlx::{self, AssertSqlSafe};
use idem::{MySqlStore, ShardedStore, ShardedTx, Store, TestClock};

const SHARDS: usize = 4;

/// Four stores, one per database, on a table named alike in each, with an effects table beside it
/// for the business writes of the tx suite.
async fn shards(clock: TestClock) -> Option<Vec<MySqlStore>> {
    let url = server::mysql_url();
    let admin = server::reach(
        "MySQL",
        &url,
        MySqlStore::connect_with(&url, 1, Duration::from_secs(2)),
    )
    .await?;
    let (base, _) = url.rsplit_once('/').unwrap();
    let table = server::unique("idem_sh");
    let mut shards = Vec::new();
    for i in 0..SHARDS {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE DATABASE IF NOT EXISTS test_idem_shard_{i}"
        )))
        .execute(admin.pool())
        .await
        .unwrap();
        let store = MySqlStore::connect_with(
            &format!("{base}/test_idem_shard_{i}"),
            16,
            Duration::from_secs(2),
        )
        .await
        .unwrap()
        .with_table(&table)
        .unwrap()
        .with_test_clock(clock.clone());
        leftovers::drop_leftovers(store.pool(), false).await;
        store.migrate().await.unwrap();
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {table}_fx (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
             biz VARCHAR(64) NOT NULL, k VARCHAR(255) NOT NULL) ENGINE = InnoDB"
        )))
        .execute(store.pool())
        .await
        .unwrap();
        shards.push(store);
    }
    Some(shards)
}

async fn store(clock: TestClock) -> Option<Arc<dyn Store>> {
    Some(Arc::new(ShardedStore::new(shards(clock).await?).unwrap()))
}

contract_suite!(store, burst = (200, 64));

struct Sharded(ShardedStore<MySqlStore>);

impl TxBackend for Sharded {
    type Tx = ShardedTx<MySqlStore>;

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
        let table = format!("{}_fx", tx.inner_mut().store().table());
        let id = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} (biz, k) VALUES (?, ?)"
        )))
        .bind(biz)
        .bind(key)
        .execute(tx.conn())
        .await
        .unwrap()
        .last_insert_id();
        i64::try_from(id).unwrap()
    }

    async fn effects(&self, biz: &str, key: &str) -> i64 {
        let mut total = 0;
        for shard in self.0.shards() {
            let n: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT COUNT(*) FROM {}_fx WHERE biz = ? AND k = ?",
                shard.table()
            )))
            .bind(biz)
            .bind(key)
            .fetch_one(shard.pool())
            .await
            .unwrap();
            total += n;
        }
        total
    }
}

async fn backend() -> Option<Arc<Sharded>> {
    Some(Arc::new(Sharded(
        ShardedStore::new(shards(TestClock::new()).await?).unwrap(),
    )))
}

mod tx {
    use super::*;
    tx_contract_suite!(backend);
}

/// Records land on every shard, each on the one the routing names and nowhere else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_spread_over_the_four_databases_by_key() {
    let Some(shards) = shards(TestClock::new()).await else {
        return;
    };
    let store = ShardedStore::new(shards).unwrap();
    for i in 0..64 {
        let key = format!("order-{i}");
        let r: Result<u32, idem::IdemError> = idem::Call::new("PAY", &key)
            .run(&store, async { Ok(i) })
            .await;
        assert_eq!(r.unwrap(), i);
    }
    let mut per_shard = Vec::new();
    for (n, shard) in store.shards().iter().enumerate() {
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {}",
            shard.table()
        )))
        .fetch_one(shard.pool())
        .await
        .unwrap();
        per_shard.push(count);
        for i in 0..64 {
            let key = format!("order-{i}");
            let here = shard.load("PAY", &key).await.unwrap().is_some();
            assert_eq!(
                here,
                std::ptr::eq(store.shard_of("PAY", &key), shard),
                "order-{i} on shard {n}"
            );
        }
    }
    assert_eq!(per_shard.iter().sum::<i64>(), 64);
    assert!(
        per_shard.iter().all(|&c| c > 0),
        "every shard is used: {per_shard:?}"
    );
}
