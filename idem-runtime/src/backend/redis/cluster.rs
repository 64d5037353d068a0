//! [`RedisClusterStore`]: the Redis store on a Redis Cluster. Every record is one key with its
//! own hash tag, so every record script runs on one slot; there is no stuck index.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{Conn, RESPONSE_TIMEOUT, Records, RedisStore, redis_error};
use crate::IdemError;
use crate::clock::ClockOffset;
use crate::store::{Claim, ClaimOutcome, ClaimRequest, Limits, Record, Store};

/// Keeps records in a Redis Cluster, through the async cluster client (which follows MOVED and
/// ASK by itself). Every record is one key with a hash tag, so every script runs on one slot.
///
/// [`Store::stuck`] is not supported on a cluster ([`IdemError::NotSupported`], so no
/// [`crate::Reconciler`]): a business type's stuck index would lie in another slot than its
/// records, and a script cannot update both in one step. Kept apart from the script, the index
/// would miss exactly the claims whose writer died between the two writes, the ones a reconciler
/// is for; a cluster keeps no index, and its claims and marks cost what they cost before.
///
/// ```no_run
/// # use idem_runtime as idem;
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// let store = idem::RedisClusterStore::connect(&[
///     "redis://127.0.0.1:7001",
///     "redis://127.0.0.1:7002",
///     "redis://127.0.0.1:7003",
/// ])
/// .await?;
/// idem::register_store("redis", store);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisClusterStore(pub(super) RedisStore);

impl RedisClusterStore {
    /// Connects to the cluster that `nodes` (some of its nodes' URLs) belong to.
    ///
    /// # Errors
    /// [`IdemError::StoreUnavailable`] when it cannot be reached.
    pub async fn connect(nodes: &[&str]) -> Result<Self, IdemError> {
        let client = redis::cluster::ClusterClientBuilder::new(nodes.to_vec())
            .response_timeout(RESPONSE_TIMEOUT)
            .connection_timeout(Duration::from_secs(2))
            .build()
            .map_err(IdemError::unavailable)?;
        let conn = client.get_async_connection().await.map_err(redis_error)?;
        Ok(RedisClusterStore(RedisStore {
            records: Arc::new(Records {
                conn: Conn::Cluster(conn),
                limits: Limits::default(),
                offset: ClockOffset::default(),
                prefix: "idem:".to_owned(),
                acks: None,
                order: Default::default(),
                registered: Default::default(),
                walk: Default::default(),
            }),
        }))
    }

    /// The same store with other limits, checked as [`RedisStore::with_limits`] checks them
    /// (a Redis string holds at most 512 MiB).
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] naming the limit Redis cannot hold and the bound.
    pub fn with_limits(self, limits: Limits) -> Result<Self, IdemError> {
        Ok(RedisClusterStore(self.0.with_limits(limits)?))
    }

    /// The same store on a [`TestClock`](crate::TestClock) (feature `test-util`).
    #[cfg(any(test, feature = "test-util"))]
    pub fn with_test_clock(self, clock: crate::clock::TestClock) -> Self {
        RedisClusterStore(self.0.with_test_clock(clock))
    }

    /// The same store with every write acknowledged by `replicas` replicas of the key's primary
    /// (see [`RedisStore::with_replica_acks`]).
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for `replicas == 0` or a zero timeout.
    pub fn with_replica_acks(self, replicas: u32, timeout: Duration) -> Result<Self, IdemError> {
        Ok(RedisClusterStore(
            self.0.with_replica_acks(replicas, timeout)?,
        ))
    }

    /// The same store with its records under another key prefix (see
    /// [`RedisStore::with_prefix`]).
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a bad prefix.
    pub fn with_prefix(self, prefix: &str) -> Result<Self, IdemError> {
        Ok(RedisClusterStore(self.0.with_prefix(prefix)?))
    }
}

#[async_trait]
impl Store for RedisClusterStore {
    fn backend(&self) -> &'static str {
        self.0.backend()
    }

    fn limits(&self) -> &Limits {
        self.0.limits()
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        self.0.claim(req).await
    }

    async fn claim_batch(
        &self,
        batch: &crate::store::BatchClaim<'_>,
    ) -> Result<Vec<ClaimOutcome>, IdemError> {
        self.0.claim_batch(batch).await
    }

    async fn complete_batch(
        &self,
        biz: &str,
        marks: &[crate::store::BatchMark<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<(), IdemError>>, IdemError> {
        self.0.complete_batch(biz, marks, ttl).await
    }

    async fn complete(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
    ) -> Result<(), IdemError> {
        self.0.complete(biz, key, claim, snapshot, ttl).await
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
        self.0
            .complete_keeping(biz, key, claim, snapshot, ttl, result_ttl)
            .await
    }

    async fn fail(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        self.0.fail(biz, key, claim).await
    }

    async fn renew(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        self.0.renew(biz, key, claim, lease).await
    }

    async fn save_steps(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        self.0.save_steps(biz, key, claim, steps).await
    }

    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        self.0.load(biz, key).await
    }

    /// The results past their result ttl, dropped from the results index of each hash slot in use
    /// (`<prefix>results{<tag>}`, a tag in the records' own slot, so the mark's script touches one
    /// slot; listed in `<prefix>results-indexes`): no SCAN. Records expire by Redis's own
    /// `PEXPIREAT`; a cluster with no result ttl in use needs no sweeper.
    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        self.0.sweep_expired(batch).await
    }

    /// Every primary's record keys scanned in turn.
    async fn stats(&self) -> Result<Vec<crate::StatusCount>, IdemError> {
        self.0.stats().await
    }

    /// The record keys of every primary `CLUSTER NODES` listed when the walk began, scanned in
    /// turn in the order of their addresses; the cursor names them by address. A failover or a
    /// node's restart during the walk fails the page that meets it (the walk starts again); a
    /// slot moved between primaries during the walk may have its records missed.
    async fn list_keys(
        &self,
        after: Option<&str>,
        batch: usize,
    ) -> Result<crate::store::KeyPage, IdemError> {
        self.0.list_keys(after, batch).await
    }
}
