//! Redis stores (feature `redis`): [`RedisStore`] on one server (a `ConnectionManager`, which
//! reconnects by itself) and [`RedisClusterStore`] on a Redis Cluster. One hash per record under a
//! hash-tagged key, `idem:{<n>:<biz>:<key>}` (`n` the business type's length: see `record_key`),
//! so every script touches one slot; every step of the protocol is one Lua script (`scripts.rs`),
//! sent as EVALSHA and loaded again on NOSCRIPT. On one server a sorted set per business type,
//! `idem:stuck:<n>:<biz>` (see `stuck_key`), indexes the PROCESSING records by lease end for
//! [`Store::stuck`]; a cluster keeps none. Errors are sorted into classes in `error.rs`.

mod batch;
mod cluster;
mod conn;
mod error;
mod eval;
mod keys;
mod read;
mod records;
pub(crate) mod scripts;
mod slots;
mod stats;
mod stuck;
mod tokens;

pub(crate) use error::redis_error;

pub use tokens::RedisTokens;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::IdemError;
use crate::clock::ClockOffset;
use crate::store::decide::millis;
use crate::store::{Claim, ClaimOutcome, ClaimRequest, Limits, Record, Store};
pub use cluster::RedisClusterStore;
use conn::Conn;
use records::{COMPLETE, COMPLETE_PLAIN, FAIL, RENEW, Records, SAVE_STEPS, int, record_of, text};

/// How long a command may wait for its reply.
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TCP settings of every connection to Redis: keepalive probes after 10 s of
/// quiet (every 5 s, 3 of them), and `TCP_USER_TIMEOUT` at [`RESPONSE_TIMEOUT`]: the kernel closes
/// a connection whose peer stopped acknowledging, so a vanished server is found even with no
/// request waiting.
pub(crate) fn tcp_settings() -> redis::io::tcp::TcpSettings {
    use redis::io::tcp::socket2::TcpKeepalive;
    let keepalive = TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(5))
        .with_retries(3);
    let settings = redis::io::tcp::TcpSettings::default().set_keepalive(keepalive);
    #[cfg(target_os = "linux")]
    let settings = settings.set_user_timeout(RESPONSE_TIMEOUT);
    settings
}

/// The key of a record: `<prefix>{<n>:<biz>:<key>}` (prefix `idem:` by default), where `<n>` is
/// the business type's length in bytes, so the key names exactly one `(biz, key)`: `("PAY", "x:y")`
/// is `idem:{3:PAY:x:y}` and `("PAY:x", "y")` is `idem:{5:PAY:x:y}`. (Read back: the digits up to
/// the first `:` are `n`, the next `n` bytes the business type, the rest before the closing brace
/// the key; a `:`, brace or backslash in either part needs no escape.) The braces make the record
/// its own hash tag on a cluster: Redis hashes what stands between the first `{` and the first `}`
/// after it, so a key with a `}` in it hashes a shorter tag, still the same one every time, and a
/// record is always one key in one slot. Token keys (`<prefix>tok:<48 hex digits>`) never begin
/// with `{` after the prefix, so they never meet a record.
///
/// Records written by idem 0.1.0's `<prefix>{biz:key}` (no length) are not read by this version:
/// they expire by themselves at their own `PEXPIREAT` (the stores guide of the `idemkit` docs, under Redis).
pub(crate) fn record_key(prefix: &str, biz: &str, key: &str) -> String {
    let mut len = itoa::Buffer::new();
    let len = len.format(biz.len());
    let mut k = String::with_capacity(prefix.len() + 4 + len.len() + biz.len() + key.len());
    k.push_str(prefix);
    k.push('{');
    k.push_str(len);
    k.push(':');
    k.push_str(biz);
    k.push(':');
    k.push_str(key);
    k.push('}');
    k
}

/// Checks a key prefix: letters, digits, `:`, `_`, `-` (it is also a SCAN pattern).
fn valid_prefix(prefix: &str) -> Result<(), IdemError> {
    if !prefix.is_empty()
        && prefix.len() <= 64
        && prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '-'))
    {
        Ok(())
    } else {
        Err(IdemError::InvalidOptions {
            reason: format!(
                "`{}` is not a key prefix idem can use: 1 to 64 of letters, digits, `:`, `_`, `-`",
                prefix.escape_default()
            ),
        })
    }
}

/// The longest string Redis holds (`proto-max-bulk-len`'s default): 512 MiB.
const REDIS_MAX_STRING: usize = 512 * 1024 * 1024;

/// What a record's key adds to its business type and key at most: the longest prefix (64 bytes),
/// the braces, the length's digits and two `:`.
const RECORD_KEY_FRAMING: usize = 64 + 2 + 20 + 2;

/// Checks `limits` against what a Redis string holds (see [`RedisStore::with_limits`]).
fn check_redis_limits(limits: &Limits) -> Result<(), IdemError> {
    crate::store::check_one_key_limits(
        "a Redis string",
        "a Redis key",
        limits,
        REDIS_MAX_STRING - RECORD_KEY_FRAMING,
        REDIS_MAX_STRING,
        " (a string of 512 MiB, less the record key's prefix and framing)",
    )
}

/// Keeps records in Redis (one server), through a `ConnectionManager` that reconnects by itself.
///
/// ```no_run
/// # use idem_runtime as idem;
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// let store = idem::RedisStore::connect("redis://127.0.0.1:6379").await?;
/// idem::register_store("redis", store);
/// # Ok(()) }
/// ```
///
/// Records expire by themselves (no sweeper needed for them). Durability is Redis's: see
/// `docs/RELIABILITY.md` for what a restart or a failover loses.
///
/// [`Store::stuck`] (the reconciler's list) reads a sorted set per business type,
/// `<prefix>stuck:<n>:<biz>`, holding the PROCESSING records by lease end; every claim, mark,
/// renewal and sweep keeps it in the same script (one more command in each). A record Redis
/// expires by itself while PROCESSING leaves its member behind until a `stuck` pass (or
/// [`Store::sweep_expired`]) meets it and drops it. The prefix's stuck indexes are listed in a
/// set, `<prefix>indexes` (added to by the claim script of each process's first claim under the
/// business type), so a sweep finds them without walking the keys.
///
/// A success marked with a result ttl ([`Call::result_ttl`](crate::Call::result_ttl)) enters a
/// sorted set `<prefix>results` scored by when its result is dropped; [`Store::sweep_expired`]
/// takes the due ones from there. A sweep pass costs what it finds (the due results, the stuck
/// and stale index members), never a walk of the keys. Results marked with a result ttl by an
/// earlier idem, without that set, are not in it: each is dropped when a claim meets it (the claim already
/// answers [`ClaimOutcome::ResultGone`]) or with its record when Redis expires it.
#[derive(Clone)]
pub struct RedisStore {
    records: Arc<Records>,
}

impl RedisStore {
    /// Connects to the Redis at `url` (`redis://host:port/db`), within
    /// [`crate::connect::DEFAULT_CONNECT_TIMEOUT`] (see [`RedisStore::connect_within`]).
    ///
    /// # Errors
    /// [`IdemError::StoreUnavailable`] naming the server and the cause when it cannot be
    /// reached; [`IdemError::InvalidOptions`] for a URL that is not Redis's.
    pub async fn connect(url: &str) -> Result<Self, IdemError> {
        Self::connect_within(url, crate::DEFAULT_CONNECT_TIMEOUT).await
    }

    /// Connects to the Redis at `url`, failing after `timeout` (1 ms ..= [`crate::MAX_DURATION`])
    /// when the server does not answer; a refused connection fails at once. Its sockets send TCP
    /// keepalives and give up on data the peer has not acknowledged for 10 s
    /// (`TCP_USER_TIMEOUT`), so a peer that vanished is noticed by the kernel too.
    ///
    /// # Errors
    /// As [`RedisStore::connect`], and [`IdemError::InvalidOptions`] for a timeout out of range.
    pub async fn connect_within(url: &str, timeout: Duration) -> Result<Self, IdemError> {
        crate::net::check_connect_timeout(timeout)?;
        let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| {
            IdemError::InvalidOptions {
                reason: format!("not a Redis URL: {e}"),
            }
        })?;
        let addr = info.addr().to_string();
        let info = info.set_tcp_settings(tcp_settings());
        let client = redis::Client::open(info).map_err(IdemError::unavailable)?;
        // redis-rs gives up on a reply after 500 ms by default; under a burst a loaded server
        // answers later than that, and a claim whose reply was given up leaves a claim nobody holds.
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(timeout));
        let manager = conn::Healing::connect(client, config, addr, timeout).await?;
        Ok(RedisStore {
            records: Arc::new(Records {
                conn: Conn::Single(manager),
                limits: Limits::default(),
                offset: ClockOffset::default(),
                prefix: "idem:".to_owned(),
                acks: None,
                order: Arc::default(),
                registered: Default::default(),
                walk: Default::default(),
            }),
        })
    }

    /// The same store with other limits, checked against what Redis holds: a string (a key, a
    /// hash field's value) of at most 512 MiB. A snapshot is one value, so at most 512 MiB; the
    /// business type and the key share the record's key (`<prefix>{<n>:<biz>:<key>}`), so
    /// together, with the longest prefix and the framing, at most 512 MiB too.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] naming the limit Redis cannot hold and the bound.
    pub fn with_limits(self, limits: Limits) -> Result<Self, IdemError> {
        check_redis_limits(&limits)?;
        Ok(self.with(|r| r.limits = limits))
    }

    /// The same store on a [`TestClock`](crate::TestClock) (feature `test-util`): every script reads Redis `TIME` plus the clock's offset.
    #[cfg(any(test, feature = "test-util"))]
    pub fn with_test_clock(self, clock: crate::clock::TestClock) -> Self {
        self.with(|r| r.offset = ClockOffset::new(clock))
    }

    /// The same store with its records under another key prefix (`idem:` by default): several
    /// services, or tests, on one Redis.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a prefix other than 1 to 64 of letters, digits, `:`,
    /// `_`, `-`.
    pub fn with_prefix(self, prefix: &str) -> Result<Self, IdemError> {
        valid_prefix(prefix)?;
        Ok(self.with(|r| r.prefix = prefix.to_owned()))
    }

    /// The same store with every write (claim, mark, renewal, token change) followed by
    /// `WAIT replicas timeout`: a write is reported done only once `replicas` replicas acknowledged
    /// it, and fails with [`IdemError::StoreUnavailable`] when fewer did in time. Redis replicates
    /// asynchronously, so without this a failover can promote a replica that never saw a claim
    /// and a duplicate runs the business again (`docs/RELIABILITY.md`). A claim refused this way
    /// stays PROCESSING until its lease ends (the body did not run); a mark refused this way is
    /// retried and then reported as not marked.
    ///
    /// `WAIT` holds the (multiplexed) connection until the replicas answer, so every call on this
    /// store pays the replication round trip. It narrows the window; it does not make Redis a
    /// consensus store (a replica can still lose an acknowledged write it had not persisted).
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for `replicas == 0` or a timeout outside 1 ms ..=
    /// [`crate::MAX_DURATION`] (`WAIT … 0` blocks forever).
    pub fn with_replica_acks(self, replicas: u32, timeout: Duration) -> Result<Self, IdemError> {
        if replicas == 0 || timeout < Duration::from_millis(1) {
            return Err(IdemError::InvalidOptions {
                reason: "with_replica_acks needs at least one replica and a timeout of at least 1 ms (`WAIT … 0` blocks forever)"
                    .to_owned(),
            });
        }
        crate::duration::check_max("the replica acknowledgement timeout", timeout)?;
        Ok(self.with(|r| r.acks = Some((replicas, timeout))))
    }

    fn with(self, change: impl FnOnce(&mut Records)) -> Self {
        let mut records = (*self.records).clone();
        // A sweep's walk under way belongs to the store it was started on (its prefix).
        records.walk = Default::default();
        change(&mut records);
        RedisStore {
            records: Arc::new(records),
        }
    }
}

#[async_trait]
impl Store for RedisStore {
    fn backend(&self) -> &'static str {
        match self.records.conn {
            Conn::Single(_) => "redis",
            Conn::Cluster(_) => "redis-cluster",
        }
    }

    fn limits(&self) -> &Limits {
        &self.records.limits
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError> {
        self.records.claim(req).await
    }

    /// One script for every key (one per hash slot on a cluster).
    async fn claim_batch(
        &self,
        batch: &crate::store::BatchClaim<'_>,
    ) -> Result<Vec<ClaimOutcome>, IdemError> {
        batch.check()?;
        let outcomes = self.records.claim_many(batch).await;
        if let Ok(outcomes) = &outcomes {
            outcomes.iter().for_each(|o| self.records.order.observe(o));
        }
        outcomes
    }

    async fn processing_biz_types(&self) -> Result<Vec<String>, IdemError> {
        self.records.processing_biz_types().await
    }

    async fn complete_batch(
        &self,
        biz: &str,
        marks: &[crate::store::BatchMark<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<(), IdemError>>, IdemError> {
        crate::store::batch::check_marks(marks)?;
        self.records.complete_many(biz, marks, ttl).await
    }

    async fn complete(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
    ) -> Result<(), IdemError> {
        let ttl = millis(ttl).to_string();
        // On one server without a test clock's offset, the mark that decides nothing about
        // either (nor a result ttl, which this mark has none of).
        if self.records.offset.ms() == 0 && matches!(self.records.conn, Conn::Single(_)) {
            return self
                .records
                .held(
                    &COMPLETE_PLAIN,
                    biz,
                    key,
                    claim,
                    &[snapshot, ttl.as_bytes()],
                )
                .await;
        }
        self.records
            .held(&COMPLETE, biz, key, claim, &[snapshot, ttl.as_bytes(), b""])
            .await
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
        let (ttl, kept) = (millis(ttl).to_string(), millis(result_ttl).to_string());
        let extra: [&[u8]; 3] = [snapshot, ttl.as_bytes(), kept.as_bytes()];
        let results = self.records.results_for(&self.records.key(biz, key));
        self.records
            .held_with(&COMPLETE, biz, key, claim, &extra, Some(&results))
            .await?;
        self.records.listed(&results).await;
        Ok(())
    }

    async fn fail(&self, biz: &str, key: &str, claim: &Claim) -> Result<(), IdemError> {
        self.records.held(&FAIL, biz, key, claim, &[]).await
    }

    async fn renew(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        lease: Duration,
    ) -> Result<(), IdemError> {
        let lease = millis(lease).to_string();
        self.records
            .held(&RENEW, biz, key, claim, &[lease.as_bytes()])
            .await
    }

    async fn save_steps(
        &self,
        biz: &str,
        key: &str,
        claim: &Claim,
        steps: &[u8],
    ) -> Result<(), IdemError> {
        self.records
            .held(&SAVE_STEPS, biz, key, claim, &[steps])
            .await
    }

    async fn load(&self, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
        self.records.load(biz, key).await
    }

    /// The results index's due members, then the registered stuck indexes' stale members: no
    /// SCAN (records expire by Redis's own `PEXPIREAT`). Under a test clock that moved, also a walk
    /// of the keys for the records past their expiry by the store's clock that Redis still keeps.
    async fn sweep_expired(&self, batch: usize) -> Result<u64, IdemError> {
        self.records.sweep(batch).await
    }

    /// One Lua script on the business type's stuck index (a sorted set by lease end, kept by every
    /// script that changes a record's status or lease): no SCAN. Members whose record Redis
    /// expired by itself are dropped as the script meets them. Records claimed by a version of idem
    /// without the index (before an upgrade) are not listed.
    async fn stuck(&self, biz: &str, batch: usize) -> Result<Vec<Record>, IdemError> {
        self.records.stuck(biz, batch).await
    }

    /// A SCAN of the prefix's record keys in batches, and each one's status (`stats.rs`).
    async fn stats(&self) -> Result<Vec<crate::StatusCount>, IdemError> {
        self.records.stats().await
    }

    /// A SCAN of the prefix's record keys, the page's room asked for at each reply (`keys.rs`):
    /// no order, and a key may come again on a later page while Redis resizes its table.
    async fn list_keys(
        &self,
        after: Option<&str>,
        batch: usize,
    ) -> Result<crate::store::KeyPage, IdemError> {
        self.records.list_keys(after, batch).await
    }
}

#[cfg(test)]
mod limit_tests {
    use super::*;

    #[test]
    fn limits_past_a_redis_string_are_refused() {
        assert!(check_redis_limits(&Limits::default()).is_ok());
        assert!(
            check_redis_limits(&Limits {
                max_snapshot_len: REDIS_MAX_STRING,
                ..Limits::default()
            })
            .is_ok()
        );
        for (limits, names) in [
            (
                Limits {
                    max_snapshot_len: REDIS_MAX_STRING + 1,
                    ..Limits::default()
                },
                "max_snapshot_len = 536870913",
            ),
            (
                Limits {
                    max_key_len: REDIS_MAX_STRING,
                    ..Limits::default()
                },
                "max_key_len",
            ),
            (
                Limits {
                    max_biz_len: REDIS_MAX_STRING / 2,
                    max_key_len: REDIS_MAX_STRING / 2,
                    max_snapshot_len: 1,
                },
                "max_biz_len + max_key_len",
            ),
        ] {
            let err = check_redis_limits(&limits).unwrap_err();
            assert!(matches!(err, IdemError::InvalidOptions { .. }), "{err:?}");
            assert!(err.to_string().contains(names), "{err}");
        }
    }
}
