//! The store contract on `PgStore`, against the local Postgres (`IDEM_PG_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`); each test's records in a table of its own.

use crate::contract;
use crate::pg;

use std::sync::Arc;

async fn store(clock: idem::TestClock) -> Option<Arc<dyn idem::Store>> {
    let store = pg::store(16).await?;
    Some(Arc::new(store.with_test_clock(clock)))
}

contract_suite!(store, burst = (200, 64));
