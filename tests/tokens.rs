//! The one-time token contract on every token backend: memory, SQLite, and (feature `redis`) Redis
//! (`IDEM_REDIS_URL`, default `redis://127.0.0.1:6379`).

mod contract;

mod memory {
    use super::contract;
    use std::sync::Arc;

    async fn tokens(clock: idem::TestClock) -> Option<Arc<dyn idem::TokenStore>> {
        Some(Arc::new(idem::MemoryTokens::new().with_test_clock(clock)))
    }

    crate::token_suite!(tokens);
}

mod sqlite {
    use super::contract;
    use std::sync::Arc;

    async fn tokens(clock: idem::TestClock) -> Option<Arc<dyn idem::TokenStore>> {
        let store = idem::SqliteStore::in_memory().await.unwrap().with_test_clock(clock);
        store.migrate().await.unwrap();
        Some(Arc::new(store.tokens()))
    }

    crate::token_suite!(tokens);
}

#[cfg(feature = "redis")]
mod redis {
    use super::contract::{self, server};
    use std::sync::Arc;

    async fn tokens(clock: idem::TestClock) -> Option<Arc<dyn idem::TokenStore>> {
        let url = server::url("IDEM_REDIS_URL", "redis://127.0.0.1:6379");
        let store = server::reach("Redis", &url, idem::RedisStore::connect(&url)).await?;
        let prefix = format!("{}:", server::unique("idemtok"));
        Some(Arc::new(
            store.with_test_clock(clock).with_prefix(&prefix).unwrap().tokens(),
        ))
    }

    crate::token_suite!(tokens);
}
