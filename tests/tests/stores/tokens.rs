//! The one-time token contract on every token backend: memory, SQLite, (feature `mysql`) MySQL /
//! MariaDB (`IDEM_MYSQL_URL`) and (feature `redis`) Redis (`IDEM_REDIS_URL`, default
//! `redis://127.0.0.1:6379`).

use crate::contract;

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
        let store = idem::SqliteStore::in_memory()
            .await
            .unwrap()
            .with_test_clock(clock);
        store.migrate().await.unwrap();
        Some(Arc::new(store.tokens()))
    }

    crate::token_suite!(tokens);
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::contract::{self, server};
    use std::sync::Arc;
    use std::time::Duration;

    use idem::TokenStore;

    /// A store whose records and tokens are in tables of their own.
    pub async fn store(clock: idem::TestClock) -> Option<idem::MySqlStore> {
        let url = server::mysql_url();
        let store = server::reach("MySQL", &url, idem::MySqlStore::connect(&url)).await?;
        let store = store
            .with_table(&server::unique("idem_tokr"))
            .unwrap()
            .with_token_table(&server::unique("idem_tok"))
            .unwrap()
            .with_test_clock(clock);
        store.migrate().await.unwrap();
        Some(store)
    }

    async fn tokens(clock: idem::TestClock) -> Option<Arc<dyn idem::TokenStore>> {
        Some(Arc::new(store(clock).await?.tokens()))
    }

    crate::token_suite!(tokens);

    /// The sweeper deletes expired MySQL tokens (spent or not) and spares live ones, counted in
    /// the table itself.
    #[tokio::test]
    async fn the_sweeper_deletes_expired_tokens_and_spares_live_ones() {
        let clock = idem::TestClock::new();
        let Some(store) = store(clock.clone()).await else {
            return;
        };
        let tokens = store.tokens();
        assert!(
            matches!(
                tokens.issue(Duration::ZERO, None).await,
                Err(idem::IdemError::InvalidOptions { .. })
            ),
            "a token that would be expired at once is refused"
        );
        let spent = tokens.issue(Duration::from_secs(10), None).await.unwrap();
        tokens.consume(&spent, None).await.unwrap();
        for _ in 0..4 {
            tokens.issue(Duration::from_secs(10), None).await.unwrap();
        }
        let live = tokens.issue(Duration::from_secs(60), None).await.unwrap();
        clock.advance(Duration::from_secs(11));
        let sweeper = idem::Sweeper::new(store.clone(), 2).with_tokens(tokens.clone());
        assert_eq!(sweeper.sweep_once().await.unwrap(), 5);
        assert!(matches!(
            tokens.consume(&spent, None).await,
            Err(idem::IdemError::TokenInvalid { .. })
        ));
        tokens.consume(&live, None).await.unwrap();
    }
}

#[cfg(feature = "redis")]
mod redis {
    use super::contract::{self, server};
    use std::sync::Arc;

    async fn tokens(clock: idem::TestClock) -> Option<Arc<dyn idem::TokenStore>> {
        let url = server::redis_url();
        let store = server::reach("Redis", &url, idem::RedisStore::connect(&url)).await?;
        let prefix = format!("{}:", server::unique("idemtok"));
        Some(Arc::new(
            store
                .with_test_clock(clock)
                .with_prefix(&prefix)
                .unwrap()
                .tokens(),
        ))
    }

    crate::token_suite!(tokens);
}

/// The sweeper deletes expired tokens (spent or not) with the records, and spares live ones: counted
/// in the table itself.
#[tokio::test]
async fn the_sweeper_deletes_expired_tokens_and_spares_live_ones() {
    use std::time::Duration;
    let clock = idem::TestClock::new();
    let store = idem::SqliteStore::in_memory()
        .await
        .unwrap()
        .with_test_clock(clock.clone());
    store.migrate().await.unwrap();
    let tokens = store.tokens();
    use idem::TokenStore;
    let spent = tokens.issue(Duration::from_secs(10), None).await.unwrap();
    tokens.consume(&spent, None).await.unwrap();
    for _ in 0..4 {
        tokens.issue(Duration::from_secs(10), None).await.unwrap();
    }
    let live = tokens.issue(Duration::from_secs(60), None).await.unwrap();
    clock.advance(Duration::from_secs(11));
    let sweeper = idem::Sweeper::new(store.clone(), 2).with_tokens(tokens.clone());
    assert_eq!(sweeper.sweep_once().await.unwrap(), 5);
    let left: Vec<String> = idem::sqlx::query_scalar("SELECT token FROM idem_token")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(left, vec![live.clone()]);
    tokens.consume(&live, None).await.unwrap();
}

#[cfg(feature = "postgres")]
use crate::pg;

#[cfg(feature = "postgres")]
mod postgres {
    use super::{contract, pg};
    use std::sync::Arc;

    async fn tokens(clock: idem::TestClock) -> Option<Arc<dyn idem::TokenStore>> {
        let store = pg::store(16).await?;
        Some(Arc::new(store.with_test_clock(clock).tokens()))
    }

    crate::token_suite!(tokens);

    /// The sweeper deletes expired tokens (spent or not) and spares live ones, on Postgres.
    #[tokio::test]
    async fn the_sweeper_deletes_expired_tokens_and_spares_live_ones() {
        use idem::TokenStore;
        use std::time::Duration;
        let clock = idem::TestClock::new();
        let Some(store) = pg::store(2).await else {
            return;
        };
        let store = store.with_test_clock(clock.clone());
        let tokens = store.tokens();
        assert!(matches!(
            tokens.issue(Duration::ZERO, None).await,
            Err(idem::IdemError::InvalidOptions { .. })
        ));
        let spent = tokens.issue(Duration::from_secs(10), None).await.unwrap();
        tokens.consume(&spent, None).await.unwrap();
        for _ in 0..4 {
            tokens.issue(Duration::from_secs(10), None).await.unwrap();
        }
        let live = tokens.issue(Duration::from_secs(60), None).await.unwrap();
        clock.advance(Duration::from_secs(11));
        let sweeper = idem::Sweeper::new(store.clone(), 2).with_tokens(tokens.clone());
        assert_eq!(sweeper.sweep_once().await.unwrap(), 5);
        let left: Vec<String> = idem::sqlx::query_scalar(idem::sqlx::AssertSqlSafe(format!(
            "SELECT token FROM {}",
            store.token_table()
        )))
        .fetch_all(store.pool())
        .await
        .unwrap();
        assert_eq!(left, vec![live.clone()]);
        tokens.consume(&live, None).await.unwrap();
        pg::drop_tables(&store).await;
    }
}
