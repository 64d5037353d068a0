//! The store contract on `MySqlStore`, against the local MariaDB / MySQL (`IDEM_MYSQL_URL`, default
//! `mysql://root@127.0.0.1:3306/test`); each test's records in a table of its own.

use crate::contract;
use crate::leftovers;

use std::sync::Arc;

use crate::contract::server;

async fn store(clock: idem::TestClock) -> Option<Arc<dyn idem::Store>> {
    let url = server::mysql_url();
    let store = server::reach("MySQL", &url, idem::MySqlStore::connect(&url)).await?;
    leftovers::drop_leftovers(store.pool(), true).await;
    let store = store
        .with_table(&server::unique("idem_c"))
        .unwrap()
        .with_test_clock(clock);
    store.migrate().await.unwrap();
    Some(Arc::new(store))
}

contract_suite!(store, burst = (200, 64));
