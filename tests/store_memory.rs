//! The store contract on `MemoryStore`.

mod contract;

use std::sync::Arc;

async fn store() -> Option<Arc<dyn idem::Store>> {
    Some(Arc::new(idem::MemoryStore::new()))
}

contract_suite!(store(), burst = (200, 64));
