//! [`AnyStore`]: the one type a store opened from a URL has, whatever its backend; its options
//! (the same on every backend that has them) and its [`Store`] implementation.
//!
//! An `AnyStore` holds the store it opened twice over: as an `Arc<dyn Store>`, which its [`Store`]
//! implementation forwards every call to (a method added to `Store` is one more line of
//! forwarding, never a match over backends), and as the concrete [`Backend`], which only what
//! needs the concrete type reads: `migrate`, `tokens`, and the options (`with_limits`,
//! `with_table`, `with_prefix`, `with_test_clock`), which build the next `AnyStore` from the
//! reconfigured backend through [`AnyStore::of`], the one place the two are made to agree.

use super::*;

/// A store opened from a URL by [`connect`]: any backend, behind one type that is a [`Store`]
/// (register it, hand it to the HTTP layer, shard over it) and can [`migrate`](AnyStore::migrate)
/// its schema.
#[derive(Clone)]
pub struct AnyStore {
    /// What every [`Store`] call goes to: `backend`'s store.
    pub(super) store: Arc<dyn Store>,
    /// The same store by its concrete type, for what `dyn Store` cannot do.
    pub(super) backend: Backend,
    pub(super) url: Arc<str>,
}

// One per opened store, made once: the size of the largest store is no cost.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub(super) enum Backend {
    /// A `memory:` store is rebuilt from these when it is reconfigured (its records are its own).
    Memory(MemoryOptions),
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
    #[cfg(feature = "dynamodb")]
    Dynamo(crate::DynamoStore),
    Sharded(Vec<AnyStore>),
}

/// How a `memory:` store was configured.
#[derive(Clone, Default)]
pub(super) struct MemoryOptions {
    limits: Limits,
    #[cfg(any(test, feature = "test-util"))]
    clock: Option<crate::clock::TestClock>,
}

impl MemoryOptions {
    pub(super) fn store(&self) -> crate::MemoryStore {
        let store = crate::MemoryStore::new()
            .with_limits(self.limits.clone())
            .unwrap_or_else(|_| unreachable!("memory holds any limits"));
        #[cfg(any(test, feature = "test-util"))]
        if let Some(clock) = &self.clock {
            return store.with_test_clock(clock.clone());
        }
        store
    }
}

impl Backend {
    /// The store this backend is, for [`AnyStore::store`] to forward to.
    fn store(&self) -> Arc<dyn Store> {
        match self {
            Backend::Memory(options) => Arc::new(options.store()),
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(s) => Arc::new(s.clone()),
            #[cfg(feature = "mysql")]
            Backend::MySql(s) => Arc::new(s.clone()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(s) => Arc::new(s.clone()),
            #[cfg(feature = "redis")]
            Backend::Redis(s) => Arc::new(s.clone()),
            #[cfg(feature = "redis")]
            Backend::RedisCluster(s) => Arc::new(s.clone()),
            #[cfg(feature = "dynamodb")]
            Backend::Dynamo(s) => Arc::new(s.clone()),
            Backend::Sharded(shards) => Arc::new(
                crate::ShardedStore::new(shards.clone())
                    .unwrap_or_else(|_| unreachable!("the same shards it was made with")),
            ),
        }
    }
}

impl std::fmt::Debug for AnyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnyStore")
            .field("backend", &self.store.backend())
            .finish_non_exhaustive()
    }
}

impl AnyStore {
    /// The shards of a `sharded:` store, in the URL's order; `None` for any other.
    pub fn shards(&self) -> Option<&[AnyStore]> {
        match &self.backend {
            Backend::Sharded(shards) => Some(shards),
            _ => None,
        }
    }

    /// Creates the store's tables and indexes if they are missing (SQL stores; every shard of a
    /// sharded one); nothing to do for memory and Redis.
    ///
    /// # Errors
    /// The backend's migration error.
    pub async fn migrate(&self) -> Result<(), IdemError> {
        match &self.backend {
            Backend::Memory(_) => Ok(()),
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(s) => s.migrate().await,
            #[cfg(feature = "mysql")]
            Backend::MySql(s) => s.migrate().await,
            #[cfg(feature = "postgres")]
            Backend::Postgres(s) => s.migrate().await,
            #[cfg(feature = "redis")]
            Backend::Redis(_) | Backend::RedisCluster(_) => Ok(()),
            #[cfg(feature = "dynamodb")]
            Backend::Dynamo(s) => s.migrate().await,
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
            Backend::Memory(_) => Arc::new(crate::MemoryTokens::new()),
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
            #[cfg(feature = "dynamodb")]
            Backend::Dynamo(s) => Arc::new(s.tokens()),
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
    #[cfg(any(test, feature = "test-util"))]
    pub fn with_test_clock(self, clock: crate::clock::TestClock) -> Self {
        let backend = match self.backend {
            Backend::Memory(mut options) => {
                options.clock = Some(clock);
                Backend::Memory(options)
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(s) => Backend::Sqlite(s.with_test_clock(clock)),
            #[cfg(feature = "mysql")]
            Backend::MySql(s) => Backend::MySql(s.with_test_clock(clock)),
            #[cfg(feature = "postgres")]
            Backend::Postgres(s) => Backend::Postgres(s.with_test_clock(clock)),
            #[cfg(feature = "redis")]
            Backend::Redis(s) => Backend::Redis(s.with_test_clock(clock)),
            #[cfg(feature = "redis")]
            Backend::RedisCluster(s) => Backend::RedisCluster(s.with_test_clock(clock)),
            #[cfg(feature = "dynamodb")]
            Backend::Dynamo(s) => Backend::Dynamo(s.with_test_clock(clock)),
            Backend::Sharded(shards) => Backend::Sharded(
                shards
                    .into_iter()
                    .map(|s| s.with_test_clock(clock.clone()))
                    .collect(),
            ),
        };
        AnyStore::of(backend, self.url)
    }

    /// The same store with other limits, delegated to the backend it holds (every shard of a
    /// sharded one), whose `with_limits` checks them against what its storage holds: SQLite 10⁹
    /// bytes a value, MySQL its columns (a biz type of 64 bytes, a key of 255, a snapshot under 16
    /// MiB), Postgres 1 GiB a value, Redis 512 MiB a string; memory holds any. A `memory:` store
    /// starts empty again (its records are its own).
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] naming the limit the backend (or a shard) cannot hold and
    /// the bound.
    pub fn with_limits(self, limits: Limits) -> Result<Self, IdemError> {
        let backend = match self.backend {
            Backend::Memory(mut options) => {
                options.limits = limits;
                Backend::Memory(options)
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(s) => Backend::Sqlite(s.with_limits(limits)?),
            #[cfg(feature = "mysql")]
            Backend::MySql(s) => Backend::MySql(s.with_limits(limits)?),
            #[cfg(feature = "postgres")]
            Backend::Postgres(s) => Backend::Postgres(s.with_limits(limits)?),
            #[cfg(feature = "redis")]
            Backend::Redis(s) => Backend::Redis(s.with_limits(limits)?),
            #[cfg(feature = "redis")]
            Backend::RedisCluster(s) => Backend::RedisCluster(s.with_limits(limits)?),
            #[cfg(feature = "dynamodb")]
            Backend::Dynamo(s) => Backend::Dynamo(s.with_limits(limits)?),
            Backend::Sharded(shards) => Backend::Sharded(
                shards
                    .into_iter()
                    .map(|s| s.with_limits(limits.clone()))
                    .collect::<Result<_, _>>()?,
            ),
        };
        Ok(AnyStore::of(backend, self.url))
    }

    /// The same store on another records table (SQL stores: SQLite, MySQL, Postgres; every shard
    /// of a sharded one, each in its own database), as the backend's `with_table` names it; run
    /// [`AnyStore::migrate`] to create it.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a name the backend cannot use, or a store without tables
    /// (memory, Redis: their records are under a key prefix, see [`AnyStore::with_prefix`]).
    pub fn with_table(self, name: &str) -> Result<Self, IdemError> {
        self.with_sql_table("with_table", name, false)
    }

    /// The same store with its submit tokens in another table (SQL stores; every shard of a
    /// sharded one), as the backend's `with_token_table` names it.
    ///
    /// # Errors
    /// As [`AnyStore::with_table`].
    pub fn with_token_table(self, name: &str) -> Result<Self, IdemError> {
        self.with_sql_table("with_token_table", name, true)
    }

    // Without an SQL backend only the sharded arm passes the name on, to shards that refuse it.
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "mysql", feature = "postgres")),
        allow(clippy::only_used_in_recursion)
    )]
    fn with_sql_table(self, method: &str, name: &str, tokens: bool) -> Result<Self, IdemError> {
        let backend_name = self.store.backend();
        let backend = match self.backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(s) => Backend::Sqlite(if tokens {
                s.with_token_table(name)?
            } else {
                s.with_table(name)?
            }),
            #[cfg(feature = "mysql")]
            Backend::MySql(s) => Backend::MySql(if tokens {
                s.with_token_table(name)?
            } else {
                s.with_table(name)?
            }),
            #[cfg(feature = "postgres")]
            Backend::Postgres(s) => Backend::Postgres(if tokens {
                s.with_token_table(name)?
            } else {
                s.with_table(name)?
            }),
            #[cfg(feature = "dynamodb")]
            Backend::Dynamo(s) if !tokens => Backend::Dynamo(s.with_table(name)?),
            Backend::Sharded(shards) => Backend::Sharded(
                shards
                    .into_iter()
                    .map(|s| s.with_sql_table(method, name, tokens))
                    .collect::<Result<_, _>>()?,
            ),
            _ => {
                return Err(IdemError::InvalidOptions {
                    reason: format!(
                        "`{method}` names a table of an SQL store (sqlite, mysql, postgres); a \
                         {backend_name} store has no tables{}",
                        if matches!(backend_name, "redis" | "redis-cluster") {
                            " (give it a key prefix: `with_prefix`)"
                        } else {
                            ""
                        }
                    ),
                });
            }
        };
        Ok(AnyStore::of(backend, self.url))
    }

    /// The same store with its records under another key prefix (Redis, Redis Cluster; every
    /// shard of a sharded one), as [`RedisStore::with_prefix`](crate::RedisStore::with_prefix)
    /// checks it.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a prefix Redis cannot use, or a store without key
    /// prefixes (memory, SQL stores: theirs is a table, see [`AnyStore::with_table`]).
    // Without Redis only the sharded arm passes the prefix on, to shards that refuse it.
    #[cfg_attr(not(feature = "redis"), allow(clippy::only_used_in_recursion))]
    pub fn with_prefix(self, prefix: &str) -> Result<Self, IdemError> {
        let backend_name = self.store.backend();
        let backend = match self.backend {
            #[cfg(feature = "redis")]
            Backend::Redis(s) => Backend::Redis(s.with_prefix(prefix)?),
            #[cfg(feature = "redis")]
            Backend::RedisCluster(s) => Backend::RedisCluster(s.with_prefix(prefix)?),
            Backend::Sharded(shards) => Backend::Sharded(
                shards
                    .into_iter()
                    .map(|s| s.with_prefix(prefix))
                    .collect::<Result<_, _>>()?,
            ),
            _ => {
                return Err(IdemError::InvalidOptions {
                    reason: format!(
                        "`with_prefix` sets the key prefix of a Redis store (redis, \
                         redis-cluster); a {backend_name} store has none{}",
                        if backend_name == "memory" {
                            ""
                        } else {
                            " (name its table instead: `with_table`)"
                        }
                    ),
                });
            }
        };
        Ok(AnyStore::of(backend, self.url))
    }

    /// The store `backend` is, opened from `url`.
    pub(super) fn of(backend: Backend, url: Arc<str>) -> Self {
        AnyStore {
            store: backend.store(),
            backend,
            url,
        }
    }

    /// The URL it was opened from, without its password.
    pub fn url(&self) -> &str {
        &self.url
    }
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

    async fn claim_batch(
        &self,
        batch: &crate::store::BatchClaim<'_>,
    ) -> Result<Vec<ClaimOutcome>, IdemError> {
        self.store.claim_batch(batch).await
    }

    async fn processing_biz_types(&self) -> Result<Vec<String>, IdemError> {
        self.store.processing_biz_types().await
    }

    async fn complete_batch(
        &self,
        biz: &str,
        marks: &[crate::store::BatchMark<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<(), IdemError>>, IdemError> {
        self.store.complete_batch(biz, marks, ttl).await
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

    async fn complete_keeping(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Duration,
    ) -> Result<(), IdemError> {
        self.store
            .complete_keeping(biz, key, claim, snapshot, ttl, result_ttl)
            .await
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

    async fn list_keys(
        &self,
        after: Option<&str>,
        batch: usize,
    ) -> Result<crate::store::KeyPage, IdemError> {
        self.store.list_keys(after, batch).await
    }

    async fn begin_transition(&self) -> Result<Box<dyn TransitionTx>, IdemError> {
        self.store.begin_transition().await
    }
}
