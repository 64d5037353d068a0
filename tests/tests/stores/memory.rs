//! The store contract on `MemoryStore`.

use crate::contract;

use std::sync::Arc;

async fn store(clock: idem::TestClock) -> Option<Arc<dyn idem::Store>> {
    Some(Arc::new(idem::MemoryStore::new().with_test_clock(clock)))
}

contract_suite!(store, burst = (200, 64));
