//! The store contract on `RedisStore`, against the local Redis (`IDEM_REDIS_URL`, default
//! `redis://127.0.0.1:6379`); each test's records under a prefix of its own.

mod contract;

use std::sync::Arc;

use contract::server;

async fn store(clock: idem::TestClock) -> Option<Arc<dyn idem::Store>> {
    let url = server::url("IDEM_REDIS_URL", "redis://127.0.0.1:6379");
    let store = server::reach("Redis", &url, idem::RedisStore::connect(&url)).await?;
    let prefix = format!("{}:", server::unique("idemt"));
    Some(Arc::new(
        store.with_test_clock(clock).with_prefix(&prefix).unwrap(),
    ))
}

contract_suite!(store, burst = (200, 64));

/// The collision a review found, through the attribute: a composite key under one business type
/// and a plain key under a business type that ends like the first key's first part. On Redis the
/// record keys were `idem:{ORDER:REFUND:7}` both; now each call runs its own body.
mod attribute_identity {
    use std::sync::atomic::{AtomicU32, Ordering};

    use idem::{IdemError, idempotent};

    static ORDER_RUNS: AtomicU32 = AtomicU32::new(0);
    static REFUND_RUNS: AtomicU32 = AtomicU32::new(0);

    #[idempotent(biz = "ORDER", key = "(\"REFUND\", id)", store = "redis_identity")]
    async fn order_step(id: u64) -> Result<String, IdemError> {
        ORDER_RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(format!("order step {id}"))
    }

    #[idempotent(biz = "ORDER:REFUND", key = "id", store = "redis_identity")]
    async fn refund(id: u64) -> Result<String, IdemError> {
        REFUND_RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(format!("refund {id}"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_composite_key_and_a_longer_biz_are_two_records() {
        let Some(store) = super::store(idem::TestClock::new()).await else {
            return;
        };
        idem::register_store("redis_identity", store);
        // Unique per run: the prefix is, and so is the id.
        let id = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        assert_eq!(order_step(id).await.unwrap(), format!("order step {id}"));
        assert_eq!(refund(id).await.unwrap(), format!("refund {id}"));
        assert_eq!(
            refund(id).await.unwrap(),
            format!("refund {id}"),
            "a replay"
        );
        assert_eq!(
            order_step(id).await.unwrap(),
            format!("order step {id}"),
            "a replay"
        );
        assert_eq!(ORDER_RUNS.load(Ordering::SeqCst), 1);
        assert_eq!(REFUND_RUNS.load(Ordering::SeqCst), 1);
    }
}
