//! The store contract on a `ShardedStore` over four `PgStore`s (four tables of their own on the
//! local Postgres, `IDEM_PG_URL`): routing by the stable hash of `(biz, key)` works over Postgres
//! shards like over any other.

use crate::contract;
use crate::pg;

use std::sync::Arc;

async fn store(clock: idem::TestClock) -> Option<Arc<dyn idem::Store>> {
    let mut shards = Vec::new();
    for _ in 0..4 {
        shards.push(pg::store(4).await?.with_test_clock(clock.clone()));
    }
    Some(Arc::new(idem::ShardedStore::new(shards).unwrap()))
}

contract_suite!(store, burst = (200, 64));
