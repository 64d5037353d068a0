//! Recovery of claims nobody retries ([`Reconciler`] is also at the crate root): a PROCESSING record whose holder died
//! and that no caller repeats stays PROCESSING until its TTL passes. The [`Reconciler`] finds such
//! records by their ended lease, asks the recover fn registered for their business type whether
//! the action happened, and backfills the result, releases the record for a retry, or leaves it.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt::Display;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::engine::retry_transient;
use crate::engine::snapshot::OkType;
use crate::store::{ClaimOutcome, ClaimRequest};
use crate::{DEFAULT_LEASE, DEFAULT_TTL, IdemError, IntoSharedStore, Store, duration, key};

type Found<'a> = Pin<Box<dyn Future<Output = Result<Option<Vec<u8>>, String>> + Send + 'a>>;

/// A recover fn registered for one business type, with its result type erased: it answers with
/// the snapshot to store.
trait Resolve: Send + Sync {
    fn resolve<'a>(&'a self, key: &'a str, limit: usize) -> Found<'a>;
}

struct ByKey<F, T, E> {
    recover: F,
    types: PhantomData<fn() -> (T, E)>,
}

impl<F, Fut, T, E> Resolve for ByKey<F, T, E>
where
    F: Fn(String) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Option<T>, E>> + Send + 'static,
    T: Serialize + DeserializeOwned + 'static,
    E: Display + 'static,
{
    fn resolve<'a>(&'a self, key: &'a str, limit: usize) -> Found<'a> {
        let found = (self.recover)(key.to_owned());
        Box::pin(async move {
            match found.await {
                // What the engine stores for the same value (or the envelope saying it could
                // not be stored, as the engine does).
                Ok(Some(value)) => Ok(Some(
                    (OkType::<T>::new().encode)(&value, limit).unwrap_or_else(|(e, _)| e),
                )),
                Ok(None) => Ok(None),
                Err(e) => Err(e.to_string()),
            }
        })
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Stuck records found (PROCESSING with an ended lease) in the registered business types.
    pub found: u64,
    /// Recover found the action: the result was stored, the record is SUCCEEDED and repeats
    /// replay it.
    pub succeeded: u64,
    /// Recover found no action: the record is FAILED, so the next call with its key runs.
    pub failed: u64,
    /// Recover could not tell (it returned an error): the record stays PROCESSING, its lease
    /// ended, for the next pass or the next caller.
    pub undecided: u64,
    /// Taken by someone else between the listing and the claim (a caller's takeover, another
    /// reconciler), or already resolved: not touched.
    pub skipped: u64,
}

/// Resolves stuck claims: PROCESSING records whose lease ended and that nobody retries.
///
/// For each business type given a recover fn (by key only: the call's inputs are gone), a pass
/// lists the stuck records in batches (an index read, see [`Store::stuck`]) and, for each, takes
/// the claim over exactly as a repeat would (atomic and fenced: a racing takeover and the
/// reconciler never both win, and a live lease is never touched), then asks the recover fn:
/// `Some(result)` is stored (SUCCEEDED, replayed to repeats), `None` marks the record FAILED (the
/// next call runs), an error leaves it PROCESSING with its lease ended.
///
/// ```no_run
/// # use idem_runtime as idem;
/// # async fn demo(store: idem_runtime::SqliteStore) -> Result<(), idem_runtime::IdemError> {
/// # async fn payment_by_order(_: &str) -> Result<Option<String>, std::io::Error> { Ok(None) }
/// let reconciler = idem::Reconciler::new(store, 200)
///     .recover("PAY", |order_no: String| async move { payment_by_order(&order_no).await })?;
/// let _task = reconciler.spawn(std::time::Duration::from_secs(60))?;
/// # Ok(()) }
/// ```
///
/// Counters: `idem_recovered_total{biz, how}` (`how`: `succeeded`, `failed`, `undecided`), and
/// the gauge `idem_stuck_records{biz}` (stuck records the last pass found).
#[derive(Clone)]
pub struct Reconciler {
    store: Arc<dyn Store>,
    by_biz: Vec<(Cow<'static, str>, Arc<dyn Resolve>)>,
    batch: usize,
    lease: Duration,
    ttl: Duration,
    store_timeout: Duration,
}

impl Reconciler {
    /// A reconciler of `store` (a store, an `Arc` of one, or an `Arc<dyn Store>`) listing `batch`
    /// records per read (1 ..= 10,000; 200 is a good start), with no business type registered.
    pub fn new(store: impl IntoSharedStore, batch: usize) -> Self {
        Reconciler {
            store: store.into_shared(),
            by_biz: Vec::new(),
            batch: batch.clamp(1, 10_000),
            lease: DEFAULT_LEASE,
            ttl: DEFAULT_TTL,
            store_timeout: crate::DEFAULT_STORE_TIMEOUT,
        }
    }

    /// Resolves the stuck records of `biz` with `recover`, called with the record's key as stored
    /// (for a composite key, its parts joined as `Call::new` joins them) and answering whether the
    /// action happened: `Ok(Some(result))` with the result the fn would have returned, `Ok(None)`
    /// when it did not happen, `Err(_)` when it cannot tell.
    ///
    /// # Errors
    /// [`IdemError::InvalidBiz`] for a business type the store refuses;
    /// [`IdemError::InvalidOptions`] for one registered twice.
    pub fn recover<F, Fut, T, E>(
        mut self,
        biz: impl Into<Cow<'static, str>>,
        recover: F,
    ) -> Result<Self, IdemError>
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<T>, E>> + Send + 'static,
        T: Serialize + DeserializeOwned + 'static,
        E: Display + 'static,
    {
        let biz = biz.into();
        key::validate_biz(&biz, self.store.limits().max_biz_len)?;
        if self.by_biz.iter().any(|(b, _)| *b == biz) {
            return Err(IdemError::InvalidOptions {
                reason: format!("the business type `{biz}` has a recover fn already"),
            });
        }
        let resolve = ByKey {
            recover,
            types: PhantomData,
        };
        self.by_biz.push((biz, Arc::new(resolve)));
        Ok(self)
    }

    /// The lease the reconciler holds a record under while its recover fn runs (default 30 s,
    /// 1 ms ..= [`crate::MAX_DURATION`], shorter than the ttl): longer than the recover fn takes.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] outside that range.
    pub fn lease(mut self, lease: Duration) -> Result<Self, IdemError> {
        crate::engine::check_durations(self.ttl, lease, None, None)?;
        self.lease = lease;
        Ok(self)
    }

    /// How long a backfilled success lives from its completion (default 7 days, longer than the
    /// lease, at most [`crate::MAX_DURATION`]): the ttl your calls of these business types use.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] outside that range.
    pub fn ttl(mut self, ttl: Duration) -> Result<Self, IdemError> {
        crate::engine::check_durations(ttl, self.lease, None, None)?;
        self.ttl = ttl;
        Ok(self)
    }

    /// The longest each of the reconciler's store steps (a list of stuck records, a claim, a
    /// mark, a release) may wait for the store, as a call's
    /// [`store_timeout`](crate::Call::store_timeout) (default 10 s, 1 ms ..=
    /// [`crate::MAX_DURATION`]): past it the pass ends with [`IdemError::StoreUnavailable`] and
    /// the claim in hand is left to its lease.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] outside that range.
    pub fn store_timeout(mut self, timeout: Duration) -> Result<Self, IdemError> {
        crate::engine::check_store_timeout(timeout)?;
        self.store_timeout = timeout;
        Ok(self)
    }

    /// `step` with its transient errors tried again, all of it within the store timeout.
    async fn bounded<T, F, Fut>(&self, step: F) -> Result<T, IdemError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, IdemError>> + Unpin,
    {
        let until = crate::engine::after(self.store_timeout);
        retry_transient(until, crate::engine::STORE_TIMEOUT, step).await
    }

    /// One pass over every registered business type, batch by batch until no stuck record is
    /// left that this pass has not seen.
    ///
    /// # Errors
    /// The store's error (listing, claiming or marking), once a transient one was tried again as
    /// the engine tries a claim; records resolved before it stay resolved, and the claim in hand
    /// is left to its lease.
    pub async fn reconcile_once(&self) -> Result<Reconciled, IdemError> {
        let mut done = Reconciled::default();
        for (biz, resolve) in &self.by_biz {
            let before = done;
            let result = self.reconcile_biz(biz, &**resolve, &mut done).await;
            crate::metrics::reconciled(
                biz,
                done.found - before.found,
                [
                    ("succeeded", done.succeeded - before.succeeded),
                    ("failed", done.failed - before.failed),
                    ("undecided", done.undecided - before.undecided),
                ],
            );
            result?;
        }
        Ok(done)
    }

    async fn reconcile_biz(
        &self,
        biz: &str,
        resolve: &dyn Resolve,
        done: &mut Reconciled,
    ) -> Result<(), IdemError> {
        let limit = self.store.limits().max_snapshot_len;
        let mut seen: HashSet<String> = HashSet::new();
        loop {
            let stuck = self.bounded(|| self.store.stuck(biz, self.batch)).await?;
            let listed = stuck.len();
            let mut new = 0;
            for record in stuck {
                if !seen.insert(record.key.clone()) {
                    continue;
                }
                new += 1;
                done.found += 1;
                self.resolve_one(biz, &record.key, resolve, limit, done)
                    .await?;
            }
            if new == 0 || listed < self.batch {
                return Ok(());
            }
            tokio::task::yield_now().await;
        }
    }

    async fn resolve_one(
        &self,
        biz: &str,
        key: &str,
        resolve: &dyn Resolve,
        limit: usize,
        done: &mut Reconciled,
    ) -> Result<(), IdemError> {
        let req = ClaimRequest {
            biz,
            key,
            fingerprint: None,
            lease: self.lease,
            ttl: self.ttl,
        };
        let claim = match self.bounded(|| self.store.claim(&req)).await? {
            ClaimOutcome::Acquired { claim, .. } => claim,
            ClaimOutcome::Replay { .. }
            | ClaimOutcome::ResultGone
            | ClaimOutcome::InProgress { .. }
            | ClaimOutcome::Mismatch => {
                done.skipped += 1;
                return Ok(());
            }
        };
        match resolve.resolve(key, limit).await {
            Ok(Some(snapshot)) => {
                match self
                    .bounded(|| self.store.complete(biz, key, &claim, &snapshot, self.ttl))
                    .await
                {
                    Ok(()) => done.succeeded += 1,
                    Err(IdemError::LeaseLost { .. }) => done.skipped += 1,
                    Err(e) => return Err(e),
                }
            }
            Ok(None) => match self.bounded(|| self.store.fail(biz, key, &claim)).await {
                Ok(()) => done.failed += 1,
                Err(IdemError::LeaseLost { .. }) => done.skipped += 1,
                Err(e) => return Err(e),
            },
            Err(why) => {
                tracing::warn!(biz, error = %why, "the recover fn could not tell whether a stuck call's action happened; the record is left");
                match self.bounded(|| self.store.release(biz, key, &claim)).await {
                    Ok(()) | Err(IdemError::LeaseLost { .. }) => done.undecided += 1,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Spawns a task that reconciles every `every` (1 ms ..= [`crate::MAX_DURATION`]) until the
    /// handle is aborted.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a period outside that range; nothing is spawned.
    pub fn spawn(self, every: Duration) -> Result<tokio::task::JoinHandle<()>, IdemError> {
        duration::check(
            "the reconciler's period",
            every,
            Duration::from_millis(1),
            "shorter than 1 ms: the reconciler would spin",
        )?;
        Ok(tokio::spawn(async move {
            loop {
                if let Err(e) = self.reconcile_once().await {
                    tracing::warn!(error = %e, "reconciling stuck idempotency records failed");
                }
                tokio::time::sleep(every).await;
            }
        }))
    }
}
