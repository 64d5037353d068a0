//! Stores from a URL: [`connect`] picks the backend by the URL's scheme, so a deployment chooses
//! its store in configuration (`IDEM_STORE_URL`) instead of in code.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::store::{Claim, ClaimOutcome, ClaimRequest, Limits, Record, Store};
use crate::transition::TransitionTx;
use crate::{IdemError, TokenStore};

/// The schemes [`connect`] knows, for its errors.
const SCHEMES: &str = "memory:, sqlite:PATH, mysql://, mariadb://, postgres://, postgresql://, \
     redis://, rediss://, redis+cluster://, sharded:URL|URL";

/// A store opened from a URL by [`connect`]: any backend, behind one type that is a [`Store`]
/// (register it, hand it to the HTTP layer, shard over it) and can [`migrate`](AnyStore::migrate)
/// its schema.
#[derive(Clone)]
pub struct AnyStore {
    store: Arc<dyn Store>,
    backend: Backend,
    url: Arc<str>,
}

// One per opened store, made once: the size of the largest store is no cost.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Backend {
    Memory,
    #[cfg(feature = "sqlite")]
    Sqlite(crate::SqliteStore),
    #[cfg(feature = "mysql")]
    MySql(crate::MySqlStore),
    #[cfg(feature = "postgres")]
    Postgres(crate::PgStore),
    #[cfg(feature = "redis")]
    Redis(crate::RedisStore),
    #[cfg(feature = "redis")]
    RedisCluster(crate::RedisClusterStore),
    Sharded(Vec<AnyStore>),
}

impl std::fmt::Debug for AnyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnyStore")
            .field("backend", &self.store.backend())
            .finish_non_exhaustive()
    }
}

impl AnyStore {
    /// Creates the store's tables and indexes if they are missing (SQL stores; every shard of a
    /// sharded one); nothing to do for memory and Redis.
    ///
    /// # Errors
    /// The backend's migration error.
    pub async fn migrate(&self) -> Result<(), IdemError> {
        match &self.backend {
            Backend::Memory => Ok(()),
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(s) => s.migrate().await,
            #[cfg(feature = "mysql")]
            Backend::MySql(s) => s.migrate().await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(s) => s.migrate().await,
            #[cfg(feature = "redis")]
            Backend::Redis(_) | Backend::RedisCluster(_) => Ok(()),
            Backend::Sharded(shards) => {
                for shard in shards {
                    Box::pin(shard.migrate()).await?;
                }
                Ok(())
            }
        }
    }

    /// The submit-token store on the same backend (the same database or server, its token table
    /// or key prefix); for `memory:`, a new [`MemoryTokens`](crate::MemoryTokens).
    ///
    /// # Errors
    /// [`IdemError::NotSupported`] for a sharded store (pick one shard's URL for tokens).
    pub fn tokens(&self) -> Result<Arc<dyn TokenStore>, IdemError> {
        Ok(match &self.backend {
            Backend::Memory => Arc::new(crate::MemoryTokens::new()),
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(s) => Arc::new(s.tokens()),
            #[cfg(feature = "mysql")]
            Backend::MySql(s) => Arc::new(s.tokens()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(s) => Arc::new(s.tokens()),
            #[cfg(feature = "redis")]
            Backend::Redis(s) => Arc::new(s.tokens()),
            #[cfg(feature = "redis")]
            Backend::RedisCluster(s) => Arc::new(s.tokens()),
            Backend::Sharded(_) => {
                return Err(IdemError::NotSupported {
                    backend: "sharded",
                    what: "submit tokens from a sharded URL (give the tokens one shard's URL)",
                });
            }
        })
    }

    /// The same store on a [`TestClock`](crate::TestClock) (every shard of a sharded one): its
    /// clock reads the test clock's offset on top of its own, for tests that move time. A
    /// `memory:` store starts empty again (its records are its own).
    pub fn with_test_clock(self, clock: crate::TestClock) -> Self {
        let (store, backend): (Arc<dyn Store>, Backend) = match self.backend {
            Backend::Memory => {
                let s = crate::MemoryStore::new().with_test_clock(clock);
                (Arc::new(s), Backend::Memory)
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(s) => {
                let s = s.with_test_clock(clock);
                (Arc::new(s.clone()), Backend::Sqlite(s))
            }
            #[cfg(feature = "mysql")]
            Backend::MySql(s) => {
                let s = s.with_test_clock(clock);
                (Arc::new(s.clone()), Backend::MySql(s))
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(s) => {
                let s = s.with_test_clock(clock);
                (Arc::new(s.clone()), Backend::Postgres(s))
            }
            #[cfg(feature = "redis")]
            Backend::Redis(s) => {
                let s = s.with_test_clock(clock);
                (Arc::new(s.clone()), Backend::Redis(s))
            }
            #[cfg(feature = "redis")]
            Backend::RedisCluster(s) => {
                let s = s.with_test_clock(clock);
                (Arc::new(s.clone()), Backend::RedisCluster(s))
            }
            Backend::Sharded(shards) => {
                let shards: Vec<AnyStore> = shards
                    .into_iter()
                    .map(|s| s.with_test_clock(clock.clone()))
                    .collect();
                let sharded = crate::ShardedStore::new(shards.clone())
                    .expect("the same shards it was made with");
                (Arc::new(sharded), Backend::Sharded(shards))
            }
        };
        AnyStore {
            store,
            backend,
            url: self.url,
        }
    }

    /// The URL it was opened from, without its password.
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// Opens the store `url` names. It does not migrate: call [`AnyStore::migrate`] where the service
/// may create its tables.
///
/// | URL | store |
/// |---|---|
/// | `memory:` | [`MemoryStore`](crate::MemoryStore) (this process only) |
/// | `sqlite:PATH`, `sqlite://PATH`, `sqlite::memory:` | [`SqliteStore`](crate::SqliteStore) on the file (created if missing), or in memory (feature `sqlite`) |
/// | `mysql://…`, `mariadb://…` | `MySqlStore` (feature `mysql`) |
/// | `postgres://…`, `postgresql://…` | `PgStore` (feature `postgres`) |
/// | `redis://…`, `rediss://…` | `RedisStore` (feature `redis`) |
/// | `redis+cluster://host:port,host:port` | `RedisClusterStore` on those seed nodes (feature `redis`) |
/// | `sharded:URL\|URL\|…` | [`ShardedStore`](crate::ShardedStore) over the stores of those URLs, in that order |
///
/// Options idem reads from the query, removed before the URL reaches the driver (whose own
/// options, such as Postgres's `sslmode`, stay): `idem_table=NAME` (MySQL, Postgres: the records'
/// table; its token table is `NAME_tok`) and `idem_prefix=P` (Redis, Redis Cluster: the keys'
/// prefix). An option a backend does not have is refused.
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
/// whose feature is off, or an option the backend does not have; the backend's own error when it
/// cannot be reached.
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
    let (store, backend): (Arc<dyn Store>, Backend) = match scheme.as_str() {
        "memory" => {
            options.none_for("memory")?;
            (Arc::new(crate::MemoryStore::new()), Backend::Memory)
        }
        "sqlite" => open_sqlite(&base, rest, &options).await?,
        "mysql" | "mariadb" => open_mysql(&base, &options).await?,
        "postgres" | "postgresql" => open_postgres(&base, &options).await?,
        "redis" | "rediss" => open_redis(&base, &options).await?,
        "redis+cluster" => open_redis_cluster(&base, &options).await?,
        _ => return Err(invalid(url, "its scheme is not one idem knows")),
    };
    Ok(AnyStore {
        store,
        backend,
        url: redacted(url).into(),
    })
}

/// The submit-token store `url` names: [`connect`]`(url)`'s [`AnyStore::tokens`].
///
/// # Errors
/// As [`connect`] and [`AnyStore::tokens`].
pub async fn connect_tokens(url: &str) -> Result<Arc<dyn TokenStore>, IdemError> {
    connect(url).await?.tokens()
}

/// The DDL [`AnyStore::migrate`] applies for the store `url` names, worked out without connecting:
/// the SQL stores' `MIGRATIONS` with the tables of the URL's `idem_table` option (its token table
/// `NAME_tok`), in order; every shard's of a sharded URL, one after the other. `None` for a store
/// without a schema (memory, Redis). For services that apply migrations with their own tool
/// (`idem migrate --print`).
///
/// # Errors
/// As [`connect`] for a URL it could not open (without its "unreachable" errors).
pub fn migrations(url: &str) -> Result<Option<Vec<String>>, IdemError> {
    let (scheme, rest) = url
        .split_once(':')
        .ok_or_else(|| invalid(url, "it has no scheme"))?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme == "sharded" {
        let mut all = Vec::new();
        for shard in rest.split('|').filter(|s| !s.trim().is_empty()) {
            if let Some(ddl) = migrations(shard.trim())? {
                all.extend(ddl);
            }
        }
        return Ok((!all.is_empty()).then_some(all));
    }
    let (base, options) = Options::split(url)?;
    match scheme.as_str() {
        "memory" => options.none_for("memory").map(|()| None),
        "sqlite" => {
            options.none_for("SQLite")?;
            if base.contains('?') {
                return Err(invalid(url, "a `sqlite:` store URL takes no query options"));
            }
            sqlite_migrations()
        }
        "mysql" | "mariadb" => {
            options.only("MySQL", true, false)?;
            mysql_migrations(options.table.as_deref())
        }
        "postgres" | "postgresql" => {
            options.only("Postgres", true, false)?;
            postgres_migrations(options.table.as_deref())
        }
        "redis" | "rediss" => options.only("Redis", false, true).map(|()| None),
        "redis+cluster" => options.only("Redis Cluster", false, true).map(|()| None),
        _ => Err(invalid(url, "its scheme is not one idem knows")),
    }
}

#[cfg(feature = "sqlite")]
fn sqlite_migrations() -> Result<Option<Vec<String>>, IdemError> {
    Ok(Some(
        crate::SqliteStore::MIGRATIONS
            .iter()
            .map(|ddl| (*ddl).to_owned())
            .collect(),
    ))
}

#[cfg(not(feature = "sqlite"))]
fn sqlite_migrations() -> Result<Option<Vec<String>>, IdemError> {
    Err(feature_off("sqlite", "sqlite"))
}

/// The records' and tokens' table names of the `idem_table` option (default names without).
#[cfg(any(feature = "mysql", feature = "postgres"))]
fn tables(
    table: Option<&str>,
) -> Result<(crate::sql::table::TableName, crate::sql::table::TableName), IdemError> {
    use crate::sql::table::TableName;
    Ok(match table {
        Some(t) => (TableName::new(t)?, TableName::new(&format!("{t}_tok"))?),
        None => (TableName::default_table(), TableName::new("idem_token")?),
    })
}

#[cfg(feature = "mysql")]
fn mysql_migrations(table: Option<&str>) -> Result<Option<Vec<String>>, IdemError> {
    let (records, tokens) = tables(table)?;
    Ok(Some(
        crate::backend::mysql::migrations_named(&records, &tokens).to_vec(),
    ))
}

#[cfg(not(feature = "mysql"))]
fn mysql_migrations(_: Option<&str>) -> Result<Option<Vec<String>>, IdemError> {
    Err(feature_off("mysql", "mysql"))
}

#[cfg(feature = "postgres")]
fn postgres_migrations(table: Option<&str>) -> Result<Option<Vec<String>>, IdemError> {
    use crate::backend::postgres::named;
    let (records, tokens) = tables(table)?;
    let [r, t, s] = crate::PgStore::MIGRATIONS;
    Ok(Some(vec![
        named(r, "idem_record", &records),
        named(t, "idem_token", &tokens),
        named(s, "idem_record", &records),
    ]))
}

#[cfg(not(feature = "postgres"))]
fn postgres_migrations(_: Option<&str>) -> Result<Option<Vec<String>>, IdemError> {
    Err(feature_off("postgres", "postgres"))
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
        _ => url.to_owned(),
    }
}

/// The options idem reads from a URL's query (`idem_…`), and the URL without them.
#[derive(Default)]
struct Options {
    table: Option<String>,
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
                "idem_prefix" => options.prefix = Some(value.into_owned()),
                other if other.starts_with("idem_") => {
                    return Err(invalid(
                        url,
                        &format!("`{other}` is not an option idem has (idem_table, idem_prefix)"),
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
        if self.prefix.is_some() && !prefix {
            return Err(refuse("idem_prefix"));
        }
        Ok(())
    }
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(
    base: &str,
    rest: &str,
    options: &Options,
) -> Result<(Arc<dyn Store>, Backend), IdemError> {
    options.none_for("SQLite")?;
    if base.contains('?') {
        return Err(IdemError::InvalidOptions {
            reason: "a `sqlite:` store URL takes no query options: write `sqlite:PATH` (the path \
                     is opened, or created, with idem's own settings)"
                .to_owned(),
        });
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
    Ok((Arc::new(store.clone()), Backend::Sqlite(store)))
}

#[cfg(not(feature = "sqlite"))]
async fn open_sqlite(
    _: &str,
    _: &str,
    _: &Options,
) -> Result<(Arc<dyn Store>, Backend), IdemError> {
    Err(feature_off("sqlite", "sqlite"))
}

#[cfg(feature = "mysql")]
async fn open_mysql(base: &str, options: &Options) -> Result<(Arc<dyn Store>, Backend), IdemError> {
    options.only("MySQL", true, false)?;
    let base = match base.split_once(':') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("mariadb") => format!("mysql:{rest}"),
        _ => base.to_owned(),
    };
    let mut store = crate::MySqlStore::connect(&base).await?;
    if let Some(table) = &options.table {
        store = store
            .with_table(table)?
            .with_token_table(&format!("{table}_tok"))?;
    }
    Ok((Arc::new(store.clone()), Backend::MySql(store)))
}

#[cfg(not(feature = "mysql"))]
async fn open_mysql(_: &str, _: &Options) -> Result<(Arc<dyn Store>, Backend), IdemError> {
    Err(feature_off("mysql", "mysql"))
}

#[cfg(feature = "postgres")]
async fn open_postgres(
    base: &str,
    options: &Options,
) -> Result<(Arc<dyn Store>, Backend), IdemError> {
    options.only("Postgres", true, false)?;
    let mut builder = crate::PgStore::builder();
    if let Some(table) = &options.table {
        builder = builder.table(table)?.token_table(&format!("{table}_tok"))?;
    }
    let store = builder.connect(base).await?;
    Ok((Arc::new(store.clone()), Backend::Postgres(store)))
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(_: &str, _: &Options) -> Result<(Arc<dyn Store>, Backend), IdemError> {
    Err(feature_off("postgres", "postgres"))
}

#[cfg(feature = "redis")]
async fn open_redis(base: &str, options: &Options) -> Result<(Arc<dyn Store>, Backend), IdemError> {
    options.only("Redis", false, true)?;
    let mut store = crate::RedisStore::connect(base).await?;
    if let Some(prefix) = &options.prefix {
        store = store.with_prefix(prefix)?;
    }
    Ok((Arc::new(store.clone()), Backend::Redis(store)))
}

#[cfg(not(feature = "redis"))]
async fn open_redis(_: &str, _: &Options) -> Result<(Arc<dyn Store>, Backend), IdemError> {
    Err(feature_off("redis", "redis"))
}

/// `redis+cluster://[user:pass@]host:port,host:port[/…]`: each seed node as a `redis://` URL
/// with the same credentials.
#[cfg(feature = "redis")]
async fn open_redis_cluster(
    base: &str,
    options: &Options,
) -> Result<(Arc<dyn Store>, Backend), IdemError> {
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
    Ok((Arc::new(store.clone()), Backend::RedisCluster(store)))
}

#[cfg(not(feature = "redis"))]
async fn open_redis_cluster(_: &str, _: &Options) -> Result<(Arc<dyn Store>, Backend), IdemError> {
    Err(feature_off("redis+cluster", "redis"))
}

#[async_trait]
impl Store for AnyStore {
    fn backend(&self) -> &'static str {
        self.store.backend()
    }

    fn limits(&self) -> &Limits {
        self.store.limits()
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        self.store.claim(req).await
    }

    async fn complete(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
    ) -> Result<(), IdemError> {
        self.store.complete(biz, key, claim, snapshot, ttl).await
    }

    async fn fail(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        self.store.fail(biz, key, claim).await
    }

    async fn renew(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        self.store.renew(biz, key, claim, lease).await
    }

    async fn release(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        self.store.release(biz, key, claim).await
    }

    async fn save_steps(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        self.store.save_steps(biz, key, claim, steps).await
    }

    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        self.store.load(biz, key).await
    }

    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        self.store.sweep_expired(batch).await
    }

    async fn stuck(&self, biz: &str, batch: usize) -> Result<Vec<Record>, IdemError> {
        self.store.stuck(biz, batch).await
    }

    async fn stats(&self) -> Result<Vec<crate::StatusCount>, IdemError> {
        self.store.stats().await
    }

    async fn begin_transition(&self) -> Result<Box<dyn TransitionTx>, IdemError> {
        self.store.begin_transition().await
    }
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

    #[tokio::test]
    async fn a_sharded_url_keeps_no_password() {
        let store = connect("sharded:memory:|memory:").await.unwrap();
        assert_eq!(store.url(), "sharded:memory:|memory:");
        assert_eq!(store.backend(), "sharded");
    }

    #[test]
    fn migrations_are_worked_out_from_the_url_alone() {
        assert_eq!(migrations("memory:").unwrap(), None);
        #[cfg(feature = "redis")]
        assert_eq!(migrations("redis://h:1/0?idem_prefix=p:").unwrap(), None);
        #[cfg(feature = "sqlite")]
        assert_eq!(migrations("sqlite:x.db").unwrap().unwrap().len(), 4);
        #[cfg(feature = "postgres")]
        {
            let ddl = migrations("postgres://u:pw@nowhere/db?idem_table=t1")
                .unwrap()
                .unwrap();
            assert!(ddl[0].contains("IF NOT EXISTS \"t1\" "), "{}", ddl[0]);
            assert!(ddl[1].contains("\"t1_tok\""), "{}", ddl[1]);
            assert!(
                ddl.iter()
                    .all(|d| !d.contains("EXISTS idem_") && !d.contains("ON idem_")),
                "{ddl:?}"
            );
        }
        #[cfg(feature = "mysql")]
        {
            let ddl = migrations("mariadb://root@nowhere/test?idem_table=t2")
                .unwrap()
                .unwrap();
            assert!(
                ddl[0].contains("`t2`") && ddl[1].contains("`t2_tok`"),
                "{ddl:?}"
            );
            assert!(ddl[2].contains("`t2_stuck`"), "{}", ddl[2]);
        }
        assert!(migrations("nope://x").is_err());
        assert!(migrations("memory:?idem_table=t").is_err());
    }

    #[test]
    fn passwords_stay_out_of_errors() {
        assert_eq!(
            redacted("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        let e = invalid("nope://u:secret@h", "x").to_string();
        assert!(!e.contains("secret") && e.contains("sqlite:PATH"), "{e}");
    }
}
