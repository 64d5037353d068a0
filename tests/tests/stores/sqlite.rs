//! The store contract on `SqliteStore`: a WAL file on disk (the embedded default).

use crate::contract;

use std::sync::Arc;

async fn store(clock: idem::TestClock) -> Option<Arc<dyn idem::Store>> {
    static DIR: std::sync::LazyLock<std::path::PathBuf> = std::sync::LazyLock::new(|| {
        let dir = std::env::temp_dir().join(format!("idem-contract-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    });
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let store = idem::SqliteStore::open(DIR.join(format!("t{n}.db")))
        .await
        .unwrap()
        .with_test_clock(clock);
    store.migrate().await.unwrap();
    Some(Arc::new(store))
}

contract_suite!(store, burst = (200, 64));
