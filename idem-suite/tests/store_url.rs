//! Stores opened from a URL (`idem::connect`), one per scheme, each through the whole store
//! contract: `memory:`, `sqlite:PATH`, `mysql://` (on the local MariaDB), `postgres://`,
//! `redis://`, and `sharded:` over two SQLite files; with the URL options `idem_table` and
//! `idem_prefix` giving each test a table or key prefix of its own. Then what a bad URL is told.

mod contract;
#[cfg(feature = "mysql")]
#[path = "support/mysql_leftovers.rs"]
mod leftovers;

use std::sync::Arc;

use contract::server;
use idem::{IdemError, Store, TestClock};

/// A store from `url` on `clock`, migrated; `None` (one skip line) when its server is down.
async fn open(service: &str, url: &str, clock: TestClock) -> Option<Arc<dyn Store>> {
    let store = server::reach(service, url, idem::connect(url)).await?;
    let store = store.with_test_clock(clock);
    store.migrate().await.unwrap();
    Some(Arc::new(store))
}

/// A fresh SQLite file in this run's temp folder.
fn sqlite_path() -> String {
    static DIR: std::sync::LazyLock<std::path::PathBuf> = std::sync::LazyLock::new(|| {
        let dir = std::env::temp_dir().join(format!("idem-url-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    });
    DIR.join(server::unique("t") + ".db").display().to_string()
}

mod memory {
    use super::*;

    async fn store(clock: TestClock) -> Option<Arc<dyn Store>> {
        open("memory", "memory:", clock).await
    }

    contract_suite!(store, burst = (50, 16));
}

mod sqlite {
    use super::*;

    async fn store(clock: TestClock) -> Option<Arc<dyn Store>> {
        open("SQLite", &format!("sqlite:{}", sqlite_path()), clock).await
    }

    contract_suite!(store, burst = (50, 16));
}

mod sharded {
    use super::*;

    async fn store(clock: TestClock) -> Option<Arc<dyn Store>> {
        let url = format!(
            "sharded:sqlite:{}|sqlite://{}",
            sqlite_path(),
            sqlite_path()
        );
        open("SQLite", &url, clock).await
    }

    contract_suite!(store, burst = (50, 16));
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;

    async fn store(clock: TestClock) -> Option<Arc<dyn Store>> {
        let base = server::url("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
        if let Ok(pool) = idem::sqlx::MySqlPool::connect(&base).await {
            leftovers::drop_leftovers(&pool, false).await;
        }
        let url = format!("{base}?idem_table={}", server::unique("idem_u"));
        open("MySQL", &url, clock).await
    }

    contract_suite!(store, burst = (50, 16));
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    async fn store(clock: TestClock) -> Option<Arc<dyn Store>> {
        let base = server::url("IDEM_PG_URL", "postgres://postgres@127.0.0.1:5432/test");
        // `idemt_<pid>_<n>`: the Postgres suites drop such tables once their process is gone.
        let url = format!("{base}?idem_table={}", server::unique("idemt"));
        open("Postgres", &url, clock).await
    }

    contract_suite!(store, burst = (50, 16));
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;

    async fn store(clock: TestClock) -> Option<Arc<dyn Store>> {
        let base = server::url("IDEM_REDIS_URL", "redis://127.0.0.1:6379");
        let url = format!("{base}?idem_prefix={}%3A", server::unique("idemt"));
        open("Redis", &url, clock).await
    }

    contract_suite!(store, burst = (50, 16));
}

/// What a URL that cannot be opened is told: the schemes idem knows, the option it misspelt, or
/// the option the backend does not have; never the password.
#[tokio::test]
async fn a_bad_url_is_told_what_idem_can_open() {
    for (url, says) in [
        ("", "no scheme"),
        ("ftp://u:hunter2@h/x", "not one idem knows"),
        ("sqlite:", "names a file"),
        ("sqlite:x.db?mode=ro", "takes no query options"),
        ("memory:?idem_table=t", "not an option of a memory"),
        ("sqlite:x.db?idem_prefix=p", "not an option of a SQLite"),
        ("memory:?idem_tabel=t", "`idem_tabel` is not an option"),
        (
            "sharded:memory:|sharded:memory:",
            "cannot itself be sharded",
        ),
    ] {
        let err = idem::connect(url).await.unwrap_err();
        assert!(
            matches!(err, IdemError::InvalidOptions { .. }),
            "{url}: {err:?}"
        );
        let text = err.to_string();
        assert!(text.contains(says), "{url}: {text}");
        assert!(!text.contains("hunter2"), "{url}: {text}");
    }
    let err = idem::connect("gopher://x").await.unwrap_err().to_string();
    for scheme in [
        "memory:",
        "sqlite:PATH",
        "mysql://",
        "postgres://",
        "redis://",
        "redis+cluster://",
        "sharded:",
    ] {
        assert!(err.contains(scheme), "{err}");
    }
}

/// The token store on the same backend: issued on one URL's store, spent once.
#[tokio::test]
async fn tokens_come_from_the_same_url() {
    let url = format!("sqlite:{}", sqlite_path());
    let store = idem::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    let tokens = store.tokens().unwrap();
    let token = tokens
        .issue(std::time::Duration::from_secs(60), Some("alice"))
        .await
        .unwrap();
    tokens.consume(&token, Some("alice")).await.unwrap();
    assert!(matches!(
        tokens.consume(&token, Some("alice")).await,
        Err(IdemError::TokenUsed)
    ));
    assert!(matches!(
        idem::connect("sharded:memory:|memory:")
            .await
            .unwrap()
            .tokens(),
        Err(IdemError::NotSupported { .. })
    ));
}
