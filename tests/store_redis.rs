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
