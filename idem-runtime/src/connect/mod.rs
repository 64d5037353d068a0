//! Stores from a URL: [`connect`](fn@connect) picks the backend by the URL's scheme, so a
//! deployment chooses its store in configuration (`IDEM_STORE_URL`) instead of in code. Here too:
//! the schema each SQL backend creates ([`migrations`]) and how long reaching a store's server may
//! take ([`DEFAULT_CONNECT_TIMEOUT`]). [`connect`](fn@connect), [`connect_tokens`] and
//! [`AnyStore`] are also at the crate root.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::store::tx::TransitionTx;
use crate::store::{Claim, ClaimOutcome, ClaimRequest, Limits, Record, Store};
use crate::{IdemError, TokenStore};

mod any;
mod ddl;
pub use any::AnyStore;
use any::{Backend, MemoryOptions};
pub use ddl::migrations;

pub use crate::net::DEFAULT_CONNECT_TIMEOUT;

/// The schemes [`connect`] knows, for its errors.
const SCHEMES: &str = "memory:, sqlite:PATH, mysql://, mariadb://, postgres://, postgresql://, \
     redis://, rediss://, redis+cluster://, dynamodb://TABLE, sharded:URL|URL";

/// Opens the store `url` names. It does not migrate: call [`AnyStore::migrate`] where the service
/// may create its tables.
///
/// | URL | store |
/// |---|---|
/// | `memory:` | [`MemoryStore`](crate::MemoryStore) (this process only) |
/// | `sqlite:PATH`, `sqlite://PATH`, `sqlite::memory:` | [`SqliteStore`](crate::SqliteStore) on the file (created if missing), or in memory (feature `sqlite`) |
/// | `mysql://…`, `mariadb://…` | `MySqlStore` (feature `mysql`) |
/// | `postgres://…`, `postgresql://…` | `PgStore` (feature `postgres`); several servers, `postgres://h1:5432,h2:5432/db?target_session_attrs=read-write` (pg_auto_failover's URL): the one that takes writes, followed when it moves |
/// | `redis://…`, `rediss://…` | `RedisStore` (feature `redis`) |
/// | `redis+cluster://host:port,host:port` | `RedisClusterStore` on those seed nodes (feature `redis`) |
/// | `dynamodb://TABLE?region=R&endpoint=URL` | `DynamoStore` on that table (feature `dynamodb`; region and endpoint optional: see `DynamoStore::connect`) |
/// | `sharded:URL\|URL\|…` | [`ShardedStore`](crate::ShardedStore) over the stores of those URLs, in that order (to add or remove one, `idem reshard` moves the keys: see [`Reshard`](crate::sharding::Reshard)) |
///
/// Options idem reads from the query, removed before the URL reaches the driver (whose own
/// options, such as Postgres's `sslmode`, stay): `idem_table=NAME` (SQLite, MySQL, Postgres: the
/// records' table; its token table is `NAME_tok`), `idem_token_table=NAME` (SQLite, MySQL,
/// Postgres: the tokens' table, whatever `idem_table` says) and `idem_prefix=P` (Redis, Redis
/// Cluster: the keys' prefix). An option a backend does not have is refused.
///
/// ```
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// # use idem_runtime as idem;
/// let url = std::env::var("IDEM_STORE_URL").unwrap_or_else(|_| "sqlite::memory:".to_owned());
/// let store = idem::connect(&url).await?;
/// store.migrate().await?;
/// idem::register_store("orders", store);
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`IdemError::InvalidOptions`] for a URL without a known scheme (the error lists them), a scheme
/// whose feature is off, an option the backend does not have, or a `postgres://` URL whose server
/// answers in another protocol (another database's port); the backend's own error when it cannot
/// be reached.
pub async fn connect(url: &str) -> Result<AnyStore, IdemError> {
    let (scheme, rest) = url
        .split_once(':')
        .ok_or_else(|| invalid(url, "it has no scheme"))?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme == "sharded" {
        let shards = rest.split('|').filter(|s| !s.trim().is_empty());
        let mut opened = Vec::new();
        for shard in shards {
            if shard
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("sharded:")
            {
                return Err(invalid(url, "a shard cannot itself be sharded"));
            }
            opened.push(Box::pin(connect(shard.trim())).await?);
        }
        let sharded = crate::ShardedStore::new(opened.clone())?;
        // Each shard's URL without its password (the whole is no URL the parser knows).
        let shards: Vec<&str> = opened.iter().map(AnyStore::url).collect();
        let url = format!("sharded:{}", shards.join("|"));
        return Ok(AnyStore {
            store: Arc::new(sharded),
            backend: Backend::Sharded(opened),
            url: url.into(),
        });
    }
    let (base, options) = Options::split(url)?;
    let backend = match scheme.as_str() {
        "memory" => {
            options.none_for("memory")?;
            Backend::Memory(MemoryOptions::default())
        }
        "sqlite" => open_sqlite(&base, rest, &options).await?,
        "mysql" | "mariadb" => open_mysql(&base, &options).await?,
        "postgres" | "postgresql" => open_postgres(&base, &options).await?,
        "redis" | "rediss" => open_redis(&base, &options).await?,
        "redis+cluster" => open_redis_cluster(&base, &options).await?,
        "dynamodb" => open_dynamo(&base, &options).await?,
        _ => return Err(invalid(url, "its scheme is not one idem knows")),
    };
    Ok(AnyStore::of(backend, redacted(url).into()))
}

/// The submit-token store `url` names: [`connect`]`(url)`'s [`AnyStore::tokens`].
///
/// # Errors
/// As [`connect`] and [`AnyStore::tokens`].
pub async fn connect_tokens(url: &str) -> Result<Arc<dyn TokenStore>, IdemError> {
    connect(url).await?.tokens()
}

fn invalid(url: &str, why: &str) -> IdemError {
    IdemError::InvalidOptions {
        reason: format!(
            "`{}` is not a store URL idem can open: {why}; write one of {SCHEMES}",
            redacted(url)
        ),
    }
}

#[allow(dead_code)]
fn feature_off(scheme: &str, feature: &str) -> IdemError {
    IdemError::InvalidOptions {
        reason: format!(
            "a `{scheme}` store URL needs idem's `{feature}` feature: turn it on in Cargo.toml"
        ),
    }
}

/// `url` without a password (for errors and [`AnyStore::url`]).
fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(_) => url.to_owned(),
        // One the parser does not read, such as a list of hosts (`postgres://u:pw@h1,h2/db`):
        // the password cut out of the text.
        Err(_) => {
            let Some((scheme, rest)) = url.split_once("://") else {
                return url.to_owned();
            };
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            let (authority, tail) = rest.split_at(end);
            match authority.rsplit_once('@') {
                Some((user, hosts)) if user.contains(':') => {
                    let name = user.split(':').next().unwrap_or_default();
                    format!("{scheme}://{name}:***@{hosts}{tail}")
                }
                _ => url.to_owned(),
            }
        }
    }
}

/// The options idem reads from a URL's query (`idem_…`), and the URL without them.
#[derive(Default)]
struct Options {
    table: Option<String>,
    token_table: Option<String>,
    prefix: Option<String>,
}

impl Options {
    fn split(url: &str) -> Result<(String, Options), IdemError> {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_owned(), Options::default()));
        };
        let mut options = Options::default();
        let mut kept = Vec::new();
        for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
            match &*name {
                "idem_table" => options.table = Some(value.into_owned()),
                "idem_token_table" => options.token_table = Some(value.into_owned()),
                "idem_prefix" => options.prefix = Some(value.into_owned()),
                other if other.starts_with("idem_") => {
                    return Err(invalid(
                        url,
                        &format!(
                            "`{other}` is not an option idem has (idem_table, idem_token_table, \
                             idem_prefix)"
                        ),
                    ));
                }
                _ => kept.push((name.into_owned(), value.into_owned())),
            }
        }
        let base = if kept.is_empty() {
            base.to_owned()
        } else {
            let query: String = url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(kept)
                .finish();
            format!("{base}?{query}")
        };
        Ok((base, options))
    }

    /// The table names `idem_table` and `idem_token_table` give, each set on `store` with its
    /// `with_table` / `with_token_table` (`with_table` alone moves the tokens to `NAME_tok`, the
    /// one rule: [`crate::sql::table::TableName::tokens_table`]); `store` unchanged without them.
    #[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
    fn apply_tables<S>(
        &self,
        mut store: S,
        with_table: impl FnOnce(S, &str) -> Result<S, IdemError>,
        with_token_table: impl FnOnce(S, &str) -> Result<S, IdemError>,
    ) -> Result<S, IdemError> {
        if let Some(table) = &self.table {
            store = with_table(store, table)?;
        }
        match &self.token_table {
            Some(tokens) => with_token_table(store, tokens),
            None => Ok(store),
        }
    }

    fn none_for(&self, backend: &str) -> Result<(), IdemError> {
        self.only(backend, false, false)
    }

    fn only(&self, backend: &str, table: bool, prefix: bool) -> Result<(), IdemError> {
        let refuse = |option: &str| IdemError::InvalidOptions {
            reason: format!("`{option}` is not an option of a {backend} store URL"),
        };
        if self.table.is_some() && !table {
            return Err(refuse("idem_table"));
        }
        if self.token_table.is_some() && !table {
            return Err(refuse("idem_token_table"));
        }
        if self.prefix.is_some() && !prefix {
            return Err(refuse("idem_prefix"));
        }
        Ok(())
    }
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(base: &str, rest: &str, options: &Options) -> Result<Backend, IdemError> {
    options.only("SQLite", true, false)?;
    if base.contains('?') {
        return Err(IdemError::InvalidOptions {
            reason: "a `sqlite:` store URL takes no query options but idem's own (`idem_table`, \
                     `idem_token_table`): write `sqlite:PATH` (the path is opened, or created, \
                     with idem's own settings)"
                .to_owned(),
        });
    }
    // The tables are checked before the file is opened: a URL refused creates nothing.
    for name in [&options.table, &options.token_table].into_iter().flatten() {
        crate::backend::sqlite::plain_table(name)?;
    }
    let path = rest.split('?').next().unwrap_or("");
    let path = path.strip_prefix("//").unwrap_or(path);
    let store = match path {
        ":memory:" => crate::SqliteStore::in_memory().await?,
        "" => {
            return Err(IdemError::InvalidOptions {
                reason: "a `sqlite:` store URL names a file: `sqlite:PATH` (or `sqlite::memory:`)"
                    .to_owned(),
            });
        }
        path => crate::SqliteStore::open(path).await?,
    };
    let store = options.apply_tables(
        store,
        crate::SqliteStore::with_table,
        crate::SqliteStore::with_token_table,
    )?;
    Ok(Backend::Sqlite(store))
}

#[cfg(not(feature = "sqlite"))]
async fn open_sqlite(_: &str, _: &str, _: &Options) -> Result<Backend, IdemError> {
    Err(feature_off("sqlite", "sqlite"))
}

#[cfg(feature = "mysql")]
async fn open_mysql(base: &str, options: &Options) -> Result<Backend, IdemError> {
    options.only("MySQL", true, false)?;
    let base = match base.split_once(':') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("mariadb") => format!("mysql:{rest}"),
        _ => base.to_owned(),
    };
    let store = crate::MySqlStore::connect(&base).await?;
    let store = options.apply_tables(
        store,
        crate::MySqlStore::with_table,
        crate::MySqlStore::with_token_table,
    )?;
    Ok(Backend::MySql(store))
}

#[cfg(not(feature = "mysql"))]
async fn open_mysql(_: &str, _: &Options) -> Result<Backend, IdemError> {
    Err(feature_off("mysql", "mysql"))
}

#[cfg(feature = "postgres")]
async fn open_postgres(base: &str, options: &Options) -> Result<Backend, IdemError> {
    options.only("Postgres", true, false)?;
    let builder = options.apply_tables(
        crate::PgStore::builder(),
        crate::PgStoreBuilder::table,
        crate::PgStoreBuilder::token_table,
    )?;
    let store = builder.connect(base).await?;
    Ok(Backend::Postgres(store))
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(_: &str, _: &Options) -> Result<Backend, IdemError> {
    Err(feature_off("postgres", "postgres"))
}

#[cfg(feature = "redis")]
async fn open_redis(base: &str, options: &Options) -> Result<Backend, IdemError> {
    options.only("Redis", false, true)?;
    let mut store = crate::RedisStore::connect(base).await?;
    if let Some(prefix) = &options.prefix {
        store = store.with_prefix(prefix)?;
    }
    Ok(Backend::Redis(store))
}

#[cfg(not(feature = "redis"))]
async fn open_redis(_: &str, _: &Options) -> Result<Backend, IdemError> {
    Err(feature_off("redis", "redis"))
}

/// `redis+cluster://[user:pass@]host:port,host:port[/…]`: each seed node as a `redis://` URL
/// with the same credentials.
#[cfg(feature = "redis")]
async fn open_redis_cluster(base: &str, options: &Options) -> Result<Backend, IdemError> {
    options.only("Redis Cluster", false, true)?;
    let rest = base
        .split_once("://")
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), rest),
    };
    let hosts = hosts.split('/').next().unwrap_or("");
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("redis://{auth}{h}"))
        .collect();
    if nodes.is_empty() {
        return Err(IdemError::InvalidOptions {
            reason: "a `redis+cluster://` URL names its seed nodes: `redis+cluster://host:port,host:port`"
                .to_owned(),
        });
    }
    let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let mut store = crate::RedisClusterStore::connect(&nodes).await?;
    if let Some(prefix) = &options.prefix {
        store = store.with_prefix(prefix)?;
    }
    Ok(Backend::RedisCluster(store))
}

#[cfg(not(feature = "redis"))]
async fn open_redis_cluster(_: &str, _: &Options) -> Result<Backend, IdemError> {
    Err(feature_off("redis+cluster", "redis"))
}

#[cfg(feature = "dynamodb")]
async fn open_dynamo(base: &str, options: &Options) -> Result<Backend, IdemError> {
    options.none_for("DynamoDB")?;
    Ok(Backend::Dynamo(crate::DynamoStore::connect(base).await?))
}

#[cfg(not(feature = "dynamodb"))]
async fn open_dynamo(_: &str, _: &Options) -> Result<Backend, IdemError> {
    Err(feature_off("dynamodb", "dynamodb"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_read_and_removed_and_others_kept() {
        let (base, o) = Options::split("postgres://u@h/db?sslmode=disable&idem_table=t1").unwrap();
        assert_eq!(base, "postgres://u@h/db?sslmode=disable");
        assert_eq!(o.table.as_deref(), Some("t1"));
        let (base, o) = Options::split("redis://h:6379/0?idem_prefix=app%3A").unwrap();
        assert_eq!(base, "redis://h:6379/0");
        assert_eq!(o.prefix.as_deref(), Some("app:"));
        assert!(Options::split("mysql://h/db?idem_tabel=x").is_err());
    }

    #[test]
    fn the_token_table_option_is_read() {
        let (base, o) = Options::split("sqlite:x.db?idem_table=t1&idem_token_table=tk").unwrap();
        assert_eq!(base, "sqlite:x.db");
        assert_eq!(o.table.as_deref(), Some("t1"));
        assert_eq!(o.token_table.as_deref(), Some("tk"));
        assert!(o.only("Redis", false, true).is_err());
    }

    #[tokio::test]
    async fn any_store_options_apply_where_the_backend_has_them() {
        let limits = Limits {
            max_key_len: 16,
            ..Limits::default()
        };
        let memory = connect("memory:").await.unwrap();
        let memory = memory.with_limits(limits.clone()).unwrap();
        assert_eq!(memory.limits(), &limits);
        for refused in [
            memory.clone().with_table("t").err(),
            memory.clone().with_token_table("t").err(),
            memory.clone().with_prefix("p:").err(),
        ] {
            assert!(
                matches!(refused, Some(IdemError::InvalidOptions { .. })),
                "{refused:?}"
            );
        }
        let sharded = connect("sharded:memory:|memory:").await.unwrap();
        let sharded = sharded.with_limits(limits.clone()).unwrap();
        assert_eq!(sharded.limits(), &limits);
        let Backend::Sharded(shards) = &sharded.backend else {
            panic!("a sharded store")
        };
        assert!(shards.iter().all(|s| s.limits() == &limits));
        let err = sharded.with_table("t").unwrap_err().to_string();
        assert!(err.contains("memory store has no tables"), "{err}");
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn an_sqlite_store_takes_tables_and_limits_not_a_prefix() {
        let store = connect("sqlite::memory:").await.unwrap();
        let store = store
            .with_table("idem_any")
            .unwrap()
            .with_token_table("idem_any_tok")
            .unwrap();
        let Backend::Sqlite(s) = &store.backend else {
            panic!("an SQLite store")
        };
        assert_eq!((s.table(), s.token_table()), ("idem_any", "idem_any_tok"));
        let err = store.clone().with_prefix("p:").unwrap_err().to_string();
        assert!(
            err.contains("with_prefix") && err.contains("sqlite"),
            "{err}"
        );
        let too_big = Limits {
            max_snapshot_len: 2_000_000_000,
            ..Limits::default()
        };
        let err = store.clone().with_limits(too_big).unwrap_err().to_string();
        assert!(err.contains("max_snapshot_len"), "{err}");
        assert!(matches!(
            store.with_table("main.x"),
            Err(IdemError::InvalidOptions { .. })
        ));
    }

    #[tokio::test]
    async fn a_sharded_url_keeps_no_password() {
        let store = connect("sharded:memory:|memory:").await.unwrap();
        assert_eq!(store.url(), "sharded:memory:|memory:");
        assert_eq!(store.backend(), "sharded");
    }

    #[test]
    fn passwords_stay_out_of_errors() {
        assert_eq!(
            redacted("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(
            redacted("postgres://u:secret@h1:5432,h2:5432/db?target_session_attrs=read-write"),
            "postgres://u:***@h1:5432,h2:5432/db?target_session_attrs=read-write"
        );
        assert_eq!(
            redacted("postgres://h1:5432,h2:5432/db"),
            "postgres://h1:5432,h2:5432/db"
        );
        let e = invalid("nope://u:secret@h", "x").to_string();
        assert!(!e.contains("secret") && e.contains("sqlite:PATH"), "{e}");
    }
}
