//! Stores opened from a URL (`idem::connect`), one per scheme, each through the whole store
//! contract: `memory:`, `sqlite:PATH`, `mysql://` (on the local MariaDB), `postgres://`,
//! `redis://`, and `sharded:` over two SQLite files; with the URL options `idem_table` (SQLite too),
//! `idem_token_table` and `idem_prefix` giving each test a table or key prefix of its own. Then what a bad URL is told.

use crate::contract;
#[cfg(feature = "mysql")]
use crate::leftovers;

use std::sync::Arc;

use crate::contract::server;
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

/// `idem_table` (and `idem_token_table`) on a `sqlite:` URL: the store keeps its records in that
/// table of the file, which `migrate()` creates.
mod sqlite_table {
    use super::*;

    async fn store(clock: TestClock) -> Option<Arc<dyn Store>> {
        let table = server::unique("idem_u");
        let url = format!(
            "sqlite:{}?idem_table={table}&idem_token_table={table}_tokens",
            sqlite_path()
        );
        open("SQLite", &url, clock).await
    }

    contract_suite!(store, burst = (50, 16));
}

/// The tables a `sqlite:` URL's options name are the ones written: a default-table store on the
/// same file sees nothing of them, and `migrations(url)` prints the same names.
#[tokio::test]
async fn a_sqlite_url_with_a_table_keeps_its_records_there() {
    let path = sqlite_path();
    let named = idem::connect(&format!("sqlite:{path}?idem_table=idem_orders"))
        .await
        .unwrap();
    named.migrate().await.unwrap();
    let ran: Result<u8, IdemError> = idem::Call::new("PAY", "k")
        .run(&named, async { Ok(1) })
        .await;
    assert_eq!(ran.unwrap(), 1);
    let plain = idem::SqliteStore::open(&path).await.unwrap();
    plain.migrate().await.unwrap();
    assert!(plain.load("PAY", "k").await.unwrap().is_none());
    let on_table = plain.clone().with_table("idem_orders").unwrap();
    assert!(on_table.load("PAY", "k").await.unwrap().is_some());
    let tokens = named.tokens().unwrap();
    let token = tokens
        .issue(std::time::Duration::from_secs(60), None)
        .await
        .unwrap();
    let in_tok: i64 = idem::sqlx::query_scalar("SELECT COUNT(*) FROM idem_orders_tok")
        .fetch_one(plain.pool())
        .await
        .unwrap();
    assert_eq!(in_tok, 1, "{token}: in `NAME_tok`");
    let ddl = idem::connect::migrations(&format!("sqlite:{path}?idem_table=idem_orders"))
        .unwrap()
        .unwrap();
    assert!(ddl[0].contains("\"idem_orders\""), "{ddl:?}");
    // And the options a `sqlite:` URL does not take are still refused.
    assert!(matches!(
        idem::connect(&format!("sqlite:{path}?idem_table=other.t")).await,
        Err(IdemError::InvalidOptions { .. })
    ));
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
        let base = server::mysql_url();
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
        let base = server::pg_url();
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
        let base = server::redis_url();
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

/// A limit past what a backend holds, for `with_limits` refusals: a key of 2 GiB is more than any
/// store but memory takes.
#[cfg(any(feature = "mysql", feature = "postgres", feature = "redis"))]
fn too_long_keys() -> idem::store::Limits {
    idem::store::Limits {
        max_key_len: 2 << 30,
        ..idem::store::Limits::default()
    }
}

/// `AnyStore::with_table` / `with_token_table` / `with_limits` on the SQL servers: applied to the
/// store it holds (its table is the one written), refused past the columns, and `with_prefix`
/// refused.
#[cfg(any(feature = "mysql", feature = "postgres"))]
#[tokio::test]
async fn any_store_names_the_tables_of_sql_servers() {
    let mut bases = Vec::new();
    #[cfg(feature = "mysql")]
    bases.push(("MySQL", server::mysql_url(), "idem_u"));
    #[cfg(feature = "postgres")]
    bases.push(("Postgres", server::pg_url(), "idemt"));
    for (service, base, prefix) in bases {
        let Some(store) = server::reach(service, &base, idem::connect(&base)).await else {
            continue;
        };
        let table = server::unique(prefix);
        let store = store
            .with_table(&table)
            .unwrap()
            .with_token_table(&format!("{table}_tok"))
            .unwrap()
            .with_limits(idem::store::Limits {
                max_key_len: 200,
                ..idem::store::Limits::default()
            })
            .unwrap();
        assert_eq!(store.limits().max_key_len, 200);
        store.migrate().await.unwrap();
        let key = "k".repeat(200);
        let ran: Result<u8, IdemError> = idem::Call::new("ANY", &key)
            .run(&store, async { Ok(1) })
            .await;
        assert_eq!(ran.unwrap(), 1, "{service}");
        assert!(store.load("ANY", &key).await.unwrap().is_some());
        let plain = idem::connect(&base).await.unwrap();
        plain.migrate().await.unwrap();
        assert!(
            plain.load("ANY", &key).await.unwrap().is_none(),
            "{service}: written in {table}, not the default table"
        );
        let err = store.clone().with_limits(too_long_keys()).unwrap_err();
        assert!(
            matches!(err, IdemError::InvalidOptions { .. })
                && err.to_string().contains("max_key_len"),
            "{service}: {err}"
        );
        let err = store.with_prefix("p:").unwrap_err().to_string();
        assert!(err.contains("with_prefix"), "{service}: {err}");
    }
}

/// `AnyStore::with_prefix` / `with_limits` on Redis: applied (its records are under the prefix),
/// refused past a Redis string, and `with_table` refused.
#[cfg(feature = "redis")]
#[tokio::test]
async fn any_store_sets_the_prefix_of_redis() {
    let base = server::redis_url();
    let Some(store) = server::reach("Redis", &base, idem::connect(&base)).await else {
        return;
    };
    let prefix = format!("{}:", server::unique("idemt"));
    let store = store.with_prefix(&prefix).unwrap();
    let ran: Result<u8, IdemError> = idem::Call::new("ANY", "k")
        .run(&store, async { Ok(1) })
        .await;
    assert_eq!(ran.unwrap(), 1);
    let other = idem::connect(&base)
        .await
        .unwrap()
        .with_prefix(&format!("{prefix}other:"))
        .unwrap();
    assert!(other.load("ANY", "k").await.unwrap().is_none());
    assert!(store.load("ANY", "k").await.unwrap().is_some());
    let err = store.clone().with_limits(too_long_keys()).unwrap_err();
    assert!(
        matches!(err, IdemError::InvalidOptions { .. }) && err.to_string().contains("max_key_len"),
        "{err}"
    );
    assert!(matches!(
        store.clone().with_prefix("bad prefix"),
        Err(IdemError::InvalidOptions { .. })
    ));
    let err = store.with_table("t").unwrap_err().to_string();
    assert!(err.contains("with_table") && err.contains("redis"), "{err}");
}

/// A sharded store takes the options of its shards, on every shard: a table on each SQLite file,
/// limits on each; and refuses what no shard has.
#[tokio::test]
async fn any_store_options_reach_every_shard() {
    let url = format!("sharded:sqlite:{}|sqlite:{}", sqlite_path(), sqlite_path());
    let store = idem::connect(&url)
        .await
        .unwrap()
        .with_table("idem_sharded")
        .unwrap()
        .with_limits(idem::store::Limits {
            max_key_len: 64,
            ..idem::store::Limits::default()
        })
        .unwrap();
    store.migrate().await.unwrap();
    assert_eq!(store.limits().max_key_len, 64);
    for key in ["a", "b", "c", "d", "e", "f"] {
        let ran: Result<u8, IdemError> = idem::Call::new("ANY", key)
            .run(&store, async { Ok(1) })
            .await;
        assert_eq!(ran.unwrap(), 1);
    }
    let over: Result<u8, IdemError> = idem::Call::new("ANY", &"k".repeat(65))
        .run(&store, async { Ok(1) })
        .await;
    assert!(
        matches!(over, Err(IdemError::InvalidKey { .. })),
        "{over:?}"
    );
    assert!(matches!(
        store.clone().with_prefix("p:"),
        Err(IdemError::InvalidOptions { .. })
    ));
    let err = store
        .with_limits(idem::store::Limits {
            max_snapshot_len: 2_000_000_000,
            ..idem::store::Limits::default()
        })
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("max_snapshot_len") && err.contains("SQLite"),
        "{err}"
    );
}

/// One naming rule for the token table, whichever way the records' table is named: a store's
/// `with_table(T)` (and Postgres's `builder().table(T)`) keeps its tokens in `T_tok`, as the
/// URL's `idem_table=T` and `idem::connect::migrations` do, so a token issued through one form is spent
/// through the other, and `migrate()` made the table both use. A token table named explicitly
/// stays, whatever `with_table` says after.
#[tokio::test]
async fn every_form_of_a_table_name_gives_the_same_token_table() {
    let mut bases = vec![("SQLite", format!("sqlite:{}", sqlite_path()), "idem_n")];
    #[cfg(feature = "mysql")]
    bases.push(("MySQL", server::mysql_url(), "idem_n"));
    #[cfg(feature = "postgres")]
    bases.push(("Postgres", server::pg_url(), "idemn"));
    for (service, base, prefix) in bases {
        let Some(plain) = server::reach(service, &base, idem::connect(&base)).await else {
            continue;
        };
        let table = server::unique(prefix);
        let built = plain.with_table(&table).unwrap();
        built.migrate().await.unwrap();
        let sep = if base.contains('?') { '&' } else { '?' };
        let by_url = idem::connect(&format!("{base}{sep}idem_table={table}"))
            .await
            .unwrap();
        let ddl = idem::connect::migrations(&format!("{base}{sep}idem_table={table}"))
            .unwrap()
            .unwrap()
            .join("\n");
        assert!(ddl.contains(&format!("{table}_tok")), "{service}: {ddl}");
        let token = built
            .tokens()
            .unwrap()
            .issue(std::time::Duration::from_secs(60), Some("alice"))
            .await
            .unwrap();
        by_url
            .tokens()
            .unwrap()
            .consume(&token, Some("alice"))
            .await
            .unwrap_or_else(|e| {
                panic!("{service}: the URL's store spends the builder's token: {e}")
            });
        assert!(matches!(
            built.tokens().unwrap().consume(&token, Some("alice")).await,
            Err(IdemError::TokenUsed)
        ));
        // A token table named first stays.
        let named = idem::connect(&base)
            .await
            .unwrap()
            .with_token_table(&format!("{table}_own"))
            .unwrap()
            .with_table(&table)
            .unwrap();
        let err = named
            .tokens()
            .unwrap()
            .issue(std::time::Duration::from_secs(60), None)
            .await
            .unwrap_err();
        assert!(
            matches!(err, IdemError::StoreSchema { .. }),
            "{service}: `{table}_own` was never migrated: {err}"
        );
    }
    #[cfg(feature = "postgres")]
    {
        let base = server::pg_url();
        if let Some(plain) = server::reach("Postgres", &base, idem::connect(&base)).await {
            drop(plain);
            let table = server::unique("idemb");
            let store = idem::PgStore::builder()
                .table(&table)
                .unwrap()
                .connect(&base)
                .await
                .unwrap();
            assert_eq!(store.token_table(), format!("{table}_tok"));
            let store = idem::PgStore::connect(&base)
                .await
                .unwrap()
                .with_table(&table)
                .unwrap();
            assert_eq!(store.token_table(), format!("{table}_tok"));
        }
    }
}

/// Files are named: a database in a directory that does not exist says which directory, and a
/// URL refused for its options creates no file.
#[tokio::test]
async fn a_sqlite_file_problem_names_the_path_and_a_refused_url_creates_nothing() {
    let dir = std::path::PathBuf::from(sqlite_path()).with_extension("d");
    let missing = dir.join("nowhere").join("orders.db");
    let err = idem::connect(&format!("sqlite:{}", missing.display()))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&missing.display().to_string())
            && err.contains(&format!(
                "{} does not exist",
                missing.parent().unwrap().display()
            )),
        "{err}"
    );
    let file = std::path::PathBuf::from(sqlite_path());
    let err = idem::connect(&format!("sqlite:{}?idem_table=bad-name", file.display()))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("bad-name"), "{err}");
    assert!(!file.exists(), "a refused URL created {}", file.display());
}
