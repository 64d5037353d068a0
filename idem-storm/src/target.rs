//! What a storm runs against: the store, how tx mode begins a transaction on it, and the ledger the
//! bodies write their effects into.
//!
//! The ledger is never the store's own bookkeeping: in lease mode it is a separate SQLite file; in
//! tx mode it is a table of the store's own database, written inside the call's transaction (that
//! is what tx mode promises: the effect and the mark commit together).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use idem::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqliteSynchronous};
use idem::sqlx::{self, Row};
use idem::state_machine::Dialect;
use idem::{IdemError, IdemTx, ShardedStore, SqliteStore, Store, TransitionTx};

use crate::StormError;
use crate::args::{Args, StoreKind};

/// The ledger table: one row per body that reached its effect.
pub(crate) const LEDGER_DDL: &str = "CREATE TABLE IF NOT EXISTS idem_storm_ledger (biz VARCHAR(64) NOT NULL, k VARCHAR(64) NOT NULL, run BIGINT NOT NULL)";

/// The ledger insert in `dialect`.
pub(crate) fn ledger_insert(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => "INSERT INTO idem_storm_ledger (biz, k, run) VALUES ($1, $2, $3)",
        _ => "INSERT INTO idem_storm_ledger (biz, k, run) VALUES (?, ?, ?)",
    }
}

/// Where the bodies' effects are counted.
pub(crate) enum Ledger {
    /// SQLite databases: the separate ledger file (lease mode), or the store's files (tx mode).
    Sqlite(Vec<SqlitePool>),
    /// The Postgres store's database (tx mode).
    #[cfg(feature = "postgres")]
    Pg(idem::sqlx::PgPool),
    /// The MySQL / MariaDB store's database (tx mode).
    #[cfg(feature = "mysql")]
    MySql(idem::sqlx::MySqlPool),
}

/// One ledger statement on whichever of sqlx's pools (their types differ, the code does not).
macro_rules! on_pool {
    (create $pool:expr) => {
        sqlx::query(LEDGER_DDL)
            .execute($pool)
            .await
            .map(drop)
            .map_err(StormError::ledger)
    };
    (insert $pool:expr, $dialect:expr, $biz:expr, $key:expr, $run:expr) => {
        sqlx::query(ledger_insert($dialect))
            .bind($biz)
            .bind($key)
            .bind($run)
            .execute($pool)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    };
    (rows $pool:expr, $sql:literal, $biz:expr) => {
        sqlx::query($sql)
            .bind($biz)
            .fetch_all($pool)
            .await
            .map_err(StormError::ledger)?
            .iter()
            .map(|r| (r.get::<String, _>(0), r.get::<i64, _>(1)))
            .collect::<Vec<_>>()
    };
}

impl Ledger {
    async fn create(&self) -> Result<(), StormError> {
        match self {
            Ledger::Sqlite(pools) => {
                for pool in pools {
                    on_pool!(create pool)?;
                }
                Ok(())
            }
            #[cfg(feature = "postgres")]
            Ledger::Pg(pool) => on_pool!(create pool),
            #[cfg(feature = "mysql")]
            Ledger::MySql(pool) => on_pool!(create pool),
        }
    }

    /// Writes one effect outside any transaction (lease mode).
    pub(crate) async fn record(&self, biz: &str, key: &str, run: i64) -> Result<(), String> {
        match self {
            Ledger::Sqlite(pools) => on_pool!(insert & pools[0], Dialect::SQLite, biz, key, run),
            #[cfg(feature = "postgres")]
            Ledger::Pg(pool) => on_pool!(insert pool, Dialect::Postgres, biz, key, run),
            #[cfg(feature = "mysql")]
            Ledger::MySql(pool) => on_pool!(insert pool, Dialect::MySQL, biz, key, run),
        }
    }

    /// The run of the first effect the ledger holds for `(biz, key)`, read from the ledger's table
    /// as a business table is read (by key, on a connection of its own), never from idem's
    /// records: what `--recover` answers a takeover with. The ledger of lease mode, the only mode
    /// `--recover` runs in, is one SQLite file, whose rowids follow the inserts.
    pub(crate) async fn first_run(&self, biz: &str, key: &str) -> Result<Option<i64>, String> {
        match self {
            Ledger::Sqlite(pools) if pools.len() == 1 => sqlx::query(
                "SELECT run FROM idem_storm_ledger WHERE biz = ? AND k = ? ORDER BY rowid LIMIT 1",
            )
            .bind(biz)
            .bind(key)
            .fetch_optional(&pools[0])
            .await
            .map(|row| row.map(|r| r.get::<i64, _>(0)))
            .map_err(|e| e.to_string()),
            _ => Err("--recover reads the lease-mode ledger (one SQLite file)".to_owned()),
        }
    }

    /// Indexes the lease-mode ledger by key, as a business table is, for `--recover`'s reads.
    async fn index_keys(&self) -> Result<(), StormError> {
        // The only variant when idem-storm is built without `postgres` and `mysql`.
        #[allow(irrefutable_let_patterns)]
        if let Ledger::Sqlite(pools) = self {
            for pool in pools {
                sqlx::query(
                    "CREATE INDEX IF NOT EXISTS idem_storm_ledger_key ON idem_storm_ledger (biz, k)",
                )
                .execute(pool)
                .await
                .map_err(StormError::ledger)?;
            }
        }
        Ok(())
    }

    /// Every effect of this storm: `(key, run)`.
    pub(crate) async fn rows(&self, biz: &str) -> Result<Vec<(String, i64)>, StormError> {
        Ok(match self {
            Ledger::Sqlite(pools) => {
                let mut out = Vec::new();
                for pool in pools {
                    out.extend(on_pool!(rows pool, "SELECT k, run FROM idem_storm_ledger WHERE biz = ?", biz));
                }
                out
            }
            #[cfg(feature = "postgres")]
            Ledger::Pg(pool) => {
                on_pool!(rows pool, "SELECT k, run FROM idem_storm_ledger WHERE biz = $1", biz)
            }
            #[cfg(feature = "mysql")]
            Ledger::MySql(pool) => {
                on_pool!(rows pool, "SELECT k, run FROM idem_storm_ledger WHERE biz = ?", biz)
            }
        })
    }
}

/// A transaction tx mode can run one call in and then commit.
pub(crate) trait StormTx: IdemTx + TransitionTx + 'static {}
impl<T: IdemTx + TransitionTx + 'static> StormTx for T {}

/// Boxed future of a transaction begun for one key.
pub(crate) type Begun<'a> =
    Pin<Box<dyn Future<Output = Result<Box<dyn StormTx>, IdemError>> + Send + 'a>>;

/// Begins the transaction a tx-mode call with `(biz, key)` runs in (on the key's shard).
pub(crate) trait BeginTx: Send + Sync {
    fn begin<'a>(&'a self, biz: &'a str, key: &'a str) -> Begun<'a>;
}

impl BeginTx for SqliteStore {
    fn begin<'a>(&'a self, _biz: &'a str, _key: &'a str) -> Begun<'a> {
        Box::pin(async move { Ok(Box::new(self.begin().await?) as Box<dyn StormTx>) })
    }
}

impl BeginTx for ShardedStore<SqliteStore> {
    fn begin<'a>(&'a self, biz: &'a str, key: &'a str) -> Begun<'a> {
        Box::pin(async move { Ok(Box::new(self.begin_for(biz, key).await?) as Box<dyn StormTx>) })
    }
}

#[cfg(feature = "postgres")]
impl BeginTx for idem::PgStore {
    fn begin<'a>(&'a self, _biz: &'a str, _key: &'a str) -> Begun<'a> {
        Box::pin(async move { Ok(Box::new(self.begin().await?) as Box<dyn StormTx>) })
    }
}

#[cfg(feature = "mysql")]
impl BeginTx for idem::MySqlStore {
    fn begin<'a>(&'a self, _biz: &'a str, _key: &'a str) -> Begun<'a> {
        Box::pin(async move { Ok(Box::new(self.begin().await?) as Box<dyn StormTx>) })
    }
}

/// The store, its transactions, the ledger, and the temporary files they live in.
pub(crate) struct Target {
    pub store: Arc<dyn Store>,
    pub tx: Option<Arc<dyn BeginTx>>,
    pub ledger: Arc<Ledger>,
    _dir: tempfile::TempDir,
}

async fn sqlite_pool(path: &std::path::Path) -> Result<SqlitePool, StormError> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(30));
    SqlitePool::connect_with(options)
        .await
        .map_err(StormError::ledger)
}

async fn sqlite_store(path: &std::path::Path) -> Result<SqliteStore, StormError> {
    let store = SqliteStore::open(path).await.map_err(StormError::store)?;
    store.migrate().await.map_err(StormError::store)?;
    Ok(store)
}

#[cfg_attr(
    all(feature = "redis", feature = "mysql", feature = "postgres"),
    allow(dead_code)
)]
fn not_built(kind: StoreKind, feature: &str) -> StormError {
    StormError::Setup(format!(
        "--store {} needs idem-storm built with the `{feature}` feature (cargo run -p idem-storm --features {feature} -- …)",
        kind.name()
    ))
}

/// How a storm process opens its target.
pub(crate) struct Opening {
    /// The lease-mode ledger's file, shared by a fault storm's processes (a temporary file when
    /// not given).
    pub ledger: Option<std::path::PathBuf>,
    /// Migrate the store and create the ledger (a fault storm's worker processes find both made).
    pub migrate: bool,
}

/// Opens the store `args` names, migrated, and the ledger for `args.mode`.
pub(crate) async fn open(args: &Args) -> Result<Target, StormError> {
    open_with(
        args,
        &Opening {
            ledger: None,
            migrate: true,
        },
    )
    .await
}

/// Opens the store `args` names and the ledger for `args.mode`, as `opening` says.
pub(crate) async fn open_with(args: &Args, opening: &Opening) -> Result<Target, StormError> {
    let dir = tempfile::Builder::new()
        .prefix("idem-storm")
        .tempdir()
        .map_err(|e| StormError::Setup(format!("cannot make a temporary directory: {e}")))?;
    let tx_mode = args.mode == crate::args::Mode::Tx;
    let ledger_file = opening
        .ledger
        .clone()
        .unwrap_or_else(|| dir.path().join("ledger.db"));
    let separate =
        || async { Ok::<_, StormError>(Ledger::Sqlite(vec![sqlite_pool(&ledger_file).await?])) };
    let (store, tx, ledger): (Arc<dyn Store>, Option<Arc<dyn BeginTx>>, Ledger) = match args.store {
        StoreKind::Memory => (Arc::new(idem::MemoryStore::new()), None, separate().await?),
        StoreKind::Sqlite => {
            let path = args
                .sqlite_path
                .clone()
                .unwrap_or_else(|| dir.path().join("store.db"));
            let store = sqlite_store(&path).await?;
            let ledger = if tx_mode {
                Ledger::Sqlite(vec![store.pool().clone()])
            } else {
                separate().await?
            };
            let store = Arc::new(store);
            (store.clone(), Some(store as Arc<dyn BeginTx>), ledger)
        }
        StoreKind::Sharded => {
            let mut shards = Vec::new();
            for i in 0..args.shards {
                shards.push(sqlite_store(&dir.path().join(format!("shard{i}.db"))).await?);
            }
            let ledger = if tx_mode {
                Ledger::Sqlite(shards.iter().map(|s| s.pool().clone()).collect())
            } else {
                separate().await?
            };
            let store = Arc::new(ShardedStore::new(shards).map_err(StormError::store)?);
            (store.clone(), Some(store as Arc<dyn BeginTx>), ledger)
        }
        StoreKind::Redis => (redis_store(args).await?, None, separate().await?),
        StoreKind::RedisCluster => (redis_cluster_store(args).await?, None, separate().await?),
        StoreKind::Mysql => mysql(args, opening.migrate, separate().await?).await?,
        StoreKind::Postgres => postgres(args, opening.migrate, separate().await?).await?,
    };
    if opening.migrate {
        ledger.create().await?;
        if args.recover {
            ledger.index_keys().await?;
        }
    }
    Ok(Target {
        store,
        tx: if tx_mode { tx } else { None },
        ledger: Arc::new(ledger),
        _dir: dir,
    })
}

#[cfg(feature = "redis")]
async fn redis_store(args: &Args) -> Result<Arc<dyn Store>, StormError> {
    Ok(Arc::new(
        idem::RedisStore::connect(&args.redis_url)
            .await
            .map_err(StormError::store)?,
    ))
}

#[cfg(not(feature = "redis"))]
async fn redis_store(args: &Args) -> Result<Arc<dyn Store>, StormError> {
    Err(not_built(args.store, "redis"))
}

#[cfg(feature = "redis")]
async fn redis_cluster_store(args: &Args) -> Result<Arc<dyn Store>, StormError> {
    let nodes: Vec<&str> = args.cluster_nodes.iter().map(String::as_str).collect();
    Ok(Arc::new(
        idem::RedisClusterStore::connect(&nodes)
            .await
            .map_err(StormError::store)?,
    ))
}

#[cfg(not(feature = "redis"))]
async fn redis_cluster_store(args: &Args) -> Result<Arc<dyn Store>, StormError> {
    Err(not_built(args.store, "redis"))
}

/// Postgres: the store's default table (migrated), the ledger in its database in tx mode.
#[cfg(feature = "postgres")]
async fn postgres(
    args: &Args,
    migrate: bool,
    separate: Ledger,
) -> Result<(Arc<dyn Store>, Option<Arc<dyn BeginTx>>, Ledger), StormError> {
    let mut builder = idem::PgStore::builder().max_connections(args.concurrency.clamp(4, 64));
    if let Some(timeout) = args.store_timeout {
        builder = builder.acquire_timeout(timeout).connect_timeout(timeout);
    }
    let store = builder
        .connect(&args.pg_url)
        .await
        .map_err(StormError::store)?;
    if migrate {
        store.migrate().await.map_err(StormError::store)?;
    }
    let ledger = if args.mode == crate::args::Mode::Tx {
        Ledger::Pg(store.pool().clone())
    } else {
        separate
    };
    let store = Arc::new(store);
    Ok((store.clone(), Some(store as Arc<dyn BeginTx>), ledger))
}

#[cfg(not(feature = "postgres"))]
async fn postgres(
    args: &Args,
    _migrate: bool,
    _separate: Ledger,
) -> Result<(Arc<dyn Store>, Option<Arc<dyn BeginTx>>, Ledger), StormError> {
    Err(not_built(args.store, "postgres"))
}

/// MySQL / MariaDB: the store's default table (migrated), the ledger in its database in tx mode.
#[cfg(feature = "mysql")]
async fn mysql(
    args: &Args,
    migrate: bool,
    separate: Ledger,
) -> Result<(Arc<dyn Store>, Option<Arc<dyn BeginTx>>, Ledger), StormError> {
    let mut builder = idem::MySqlStore::builder().max_connections(args.concurrency.clamp(4, 64));
    if let Some(timeout) = args.store_timeout {
        builder = builder.acquire_timeout(timeout).connect_timeout(timeout);
    }
    let store = builder
        .connect(&args.mysql_url)
        .await
        .map_err(StormError::store)?;
    if migrate {
        store.migrate().await.map_err(StormError::store)?;
    }
    let ledger = if args.mode == crate::args::Mode::Tx {
        Ledger::MySql(store.pool().clone())
    } else {
        separate
    };
    let store = Arc::new(store);
    Ok((store.clone(), Some(store as Arc<dyn BeginTx>), ledger))
}

#[cfg(not(feature = "mysql"))]
async fn mysql(
    args: &Args,
    _migrate: bool,
    _separate: Ledger,
) -> Result<(Arc<dyn Store>, Option<Arc<dyn BeginTx>>, Ledger), StormError> {
    Err(not_built(args.store, "mysql"))
}
