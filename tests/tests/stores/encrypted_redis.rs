//! The store contract on `EncryptedStore<RedisStore>`, against the local Redis (`IDEM_REDIS_URL`,
//! default `redis://127.0.0.1:6379`; one skip line when it is unreachable, unless
//! `IDEM_REQUIRE_SERVICES=1`): sealed snapshots as binary hash fields, the protocol in Lua as before.

use crate::contract;

use std::sync::Arc;

use crate::contract::server;
use idem::{EncryptedStore, Keyring};

async fn store(clock: idem::TestClock) -> Option<Arc<dyn idem::Store>> {
    let url = server::redis_url();
    let store = server::reach("Redis", &url, idem::RedisStore::connect(&url)).await?;
    let prefix = format!("{}:", server::unique("idemt"));
    let store = store.with_test_clock(clock).with_prefix(&prefix).unwrap();
    let keyring = Keyring::new(1, [3u8; 32]).unwrap();
    Some(Arc::new(EncryptedStore::new(store, keyring)))
}

contract_suite!(store, burst = (200, 64));
