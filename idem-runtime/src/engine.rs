//! The claim → execute → mark engine behind `#[idempotent]`.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tracing::Instrument;

use crate::metrics::{Outcome, report};
use crate::store::{Acquired, ClaimOutcome, ClaimRequest, Store};
use crate::{IdemError, IdemKey, fingerprint, key};

/// Default record lifetime: 7 days.
pub const DEFAULT_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default lease: 30 seconds.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// One idempotent call, built by hand or by `#[idempotent]`.
///
/// ```
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// use idem_runtime::{Call, MemoryStore};
/// let store = MemoryStore::new();
/// let receipt: Result<String, idem_runtime::IdemError> = Call::new("PAY", "order-1")
///     .run(&store, async { Ok("paid".to_owned()) })
///     .await;
/// assert_eq!(receipt?, "paid");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Call {
    biz: Cow<'static, str>,
    key: String,
    fingerprint: Option<Result<String, String>>,
    ttl: Duration,
    lease: Duration,
    wait: Option<Duration>,
}

impl Call {
    /// A call for `(biz, key)` with the default TTL (7 days) and lease (30 s), no fingerprint, and
    /// in-progress repeats rejected.
    pub fn new<K: IdemKey + ?Sized>(biz: impl Into<Cow<'static, str>>, key: &K) -> Self {
        Call {
            biz: biz.into(),
            key: key.to_key(),
            fingerprint: None,
            ttl: DEFAULT_TTL,
            lease: DEFAULT_LEASE,
            wait: None,
        }
    }

    /// How long the record lives.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long a claim protects itself before another attempt may take it over.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Wait up to `max` for an in-progress call to finish (then replay it) instead of refusing at once.
    pub fn wait(mut self, max: Duration) -> Self {
        self.wait = Some(max);
        self
    }

    /// Fingerprints `payload`: a repeat with the same key and another payload gets
    /// [`IdemError::PayloadMismatch`].
    pub fn fingerprint<P: Serialize + ?Sized>(mut self, payload: &P) -> Self {
        self.fingerprint = Some(fingerprint::fingerprint(payload));
        self
    }

    /// The business type.
    pub fn biz(&self) -> &str {
        &self.biz
    }

    /// The key as stored.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Runs `body` at most once for this call's `(biz, key)` on `store`.
    ///
    /// # Errors
    /// The body's own error, or an [`IdemError`] converted into `E`: refused repeats
    /// (`InProgress`, `PayloadMismatch`), bad input (`InvalidKey`, …), store failures, `LeaseLost`.
    #[inline(always)]
    pub fn run<'a, T, E, F>(
        self,
        store: &'a dyn Store,
        body: F,
    ) -> impl Future<Output = Result<T, E>> + 'a
    where
        T: Serialize + DeserializeOwned + 'a,
        E: From<IdemError> + 'a,
        F: Future<Output = Result<T, E>> + 'a,
    {
        execute(
            Ok(StoreHandle::Borrowed(store)),
            self,
            OkType::new(),
            ErrType::new(),
            body,
        )
    }

    fn request(&self, store: &dyn Store) -> Result<ClaimRequest<'_>, IdemError> {
        let limits = store.limits();
        key::validate_biz(&self.biz, limits.max_biz_len)?;
        key::validate_key(&self.key, limits.max_key_len)?;
        if self.ttl <= self.lease {
            return Err(IdemError::InvalidOptions {
                reason: format!(
                    "ttl {:?} must be longer than the lease {:?}",
                    self.ttl, self.lease
                ),
            });
        }
        let fingerprint = match &self.fingerprint {
            None => None,
            Some(Ok(fp)) => Some(fp.as_str()),
            Some(Err(reason)) => {
                return Err(IdemError::Fingerprint {
                    reason: reason.clone(),
                });
            }
        };
        Ok(ClaimRequest {
            biz: &self.biz,
            key: &self.key,
            fingerprint,
            lease: self.lease,
            ttl: self.ttl,
        })
    }
}

/// What a stored snapshot holds: the result, or why it could not be stored.
#[derive(Serialize)]
enum SnapshotRef<'a, T> {
    Ok(&'a T),
    Unstorable(&'a str),
}

#[derive(Deserialize)]
enum SnapshotOwned<T> {
    Ok(T),
    Unstorable(String),
}

/// Serializes a result for storage; `Err` holds the envelope to store instead and the error to return.
fn encode<T: Serialize>(value: &T, limit: usize) -> Result<Vec<u8>, (Vec<u8>, IdemError)> {
    let mut bytes = Vec::with_capacity(64);
    let reason = match serde_json::to_writer(&mut bytes, &SnapshotRef::Ok(value)).map(|()| bytes) {
        Ok(bytes) if bytes.len() <= limit => return Ok(bytes),
        Ok(bytes) => format!(
            "the result is {} bytes; the store's snapshot limit is {limit}",
            bytes.len()
        ),
        Err(e) => format!("the result failed to serialize: {e}"),
    };
    let envelope =
        serde_json::to_vec(&SnapshotRef::<()>::Unstorable(&reason)).expect("a string serializes");
    Err((envelope, IdemError::ResultNotStorable { reason }))
}

fn decode<T: DeserializeOwned>(snapshot: &[u8]) -> Result<T, IdemError> {
    match serde_json::from_slice::<SnapshotOwned<T>>(snapshot) {
        Ok(SnapshotOwned::Ok(v)) => Ok(v),
        Ok(SnapshotOwned::Unstorable(reason)) => Err(IdemError::ResultNotStorable { reason }),
        Err(e) => Err(IdemError::ReplayDecode {
            reason: e.to_string(),
        }),
    }
}

/// Serializes a result within a size limit; `Err` holds the envelope to store instead and the error.
type Encoder<T> = fn(&T, usize) -> Result<Vec<u8>, (Vec<u8>, IdemError)>;

/// Proof that a fn's `Ok` type can be stored and replayed: its encoder and decoder.
///
/// Made by a bounded constructor, so the engine entry points that take it need no bounds of their
/// own: a type that is not storable is reported once, where the proof is made.
pub struct OkType<T> {
    encode: Encoder<T>,
    decode: fn(&[u8]) -> Result<T, IdemError>,
}

impl<T> Clone for OkType<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for OkType<T> {}

impl<T: Serialize + DeserializeOwned> OkType<T> {
    /// The proof for `T`.
    pub fn new() -> Self {
        OkType {
            encode: encode::<T>,
            decode: decode::<T>,
        }
    }
}

impl<T: Serialize + DeserializeOwned> Default for OkType<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Proof that a fn's error type can carry an [`IdemError`].
pub struct ErrType<E> {
    from: fn(IdemError) -> E,
}

impl<E> Clone for ErrType<E> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<E> Copy for ErrType<E> {}

impl<E: From<IdemError>> ErrType<E> {
    /// The proof for `E`.
    pub fn new() -> Self {
        ErrType { from: E::from }
    }
}

impl<E: From<IdemError>> Default for ErrType<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> ErrType<E> {
    /// Converts an idem error into the fn's error type.
    pub fn from_idem(self, e: IdemError) -> E {
        (self.from)(e)
    }
}

fn finish_span(outcome: Outcome, attempt: u32) {
    let span = tracing::Span::current();
    span.record("outcome", outcome.as_str());
    if attempt > 0 {
        span.record("attempt", attempt);
    }
}

fn acquired_outcome(how: Acquired) -> Outcome {
    match how {
        Acquired::TakeOver => Outcome::TakenOver,
        Acquired::Fresh | Acquired::RetryAfterFailure => Outcome::Executed,
    }
}

/// Claims, waiting for an in-progress holder when the call allows it.
async fn claim(
    store: &dyn Store,
    req: &ClaimRequest<'_>,
    wait: Option<Duration>,
) -> Result<ClaimOutcome, IdemError> {
    let deadline = wait.map(|w| tokio::time::Instant::now() + w);
    let mut pause = Duration::from_millis(5);
    loop {
        let outcome = store.claim(req).await?;
        let ClaimOutcome::InProgress { retry_after } = outcome else {
            return Ok(outcome);
        };
        let now = tokio::time::Instant::now();
        match deadline {
            Some(deadline) if now < deadline => {
                let nap = pause
                    .min(retry_after.max(Duration::from_millis(1)))
                    .min(deadline - now);
                tokio::time::sleep(nap).await;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            _ => return Ok(ClaimOutcome::InProgress { retry_after }),
        }
    }
}

/// The one engine path: `Call::run` and `#[idempotent]` both end here, so the attribute costs
/// nothing over the hand-written call.
async fn execute<T, E, F>(
    store: Result<StoreHandle<'_>, IdemError>,
    call: Call,
    ok: OkType<T>,
    err: ErrType<E>,
    body: F,
) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
{
    let span = tracing::info_span!(
        "idem",
        biz = %call.biz,
        outcome = tracing::field::Empty,
        attempt = tracing::field::Empty
    );
    async move {
        let biz = call.biz();
        let refuse = |e: IdemError, outcome: Outcome| {
            finish_span(outcome, 0);
            report(biz, outcome, 0);
            Err(err.from_idem(e))
        };
        let handle = match store {
            Ok(handle) => handle,
            Err(e) => return refuse(e, Outcome::Rejected),
        };
        let store = handle.get();
        let req = match call.request(store) {
            Ok(req) => req,
            Err(e) => return refuse(e, Outcome::Rejected),
        };
        let (attempt, how) = match claim(store, &req, call.wait).await {
            Ok(ClaimOutcome::Acquired { attempt, how }) => (attempt, how),
            Ok(ClaimOutcome::Replay { snapshot }) => {
                return match (ok.decode)(&snapshot) {
                    Ok(v) => {
                        finish_span(Outcome::Replayed, 0);
                        report(biz, Outcome::Replayed, 0);
                        Ok(v)
                    }
                    Err(e) => refuse(e, Outcome::Replayed),
                };
            }
            Ok(ClaimOutcome::Mismatch) => return refuse(IdemError::PayloadMismatch, Outcome::Mismatch),
            Ok(ClaimOutcome::InProgress { retry_after }) => {
                return refuse(IdemError::InProgress { retry_after }, Outcome::InProgress);
            }
            Err(e) => return refuse(e, Outcome::Rejected),
        };
        // From here the claim is ours. A panic or a dropped future leaves it PROCESSING: the lease
        // expires and a later attempt takes over; nothing ever claims a success that did not happen.
        let out = body.await;
        let (result, outcome) = match out {
            Ok(value) => {
                let (snapshot, result) = match (ok.encode)(&value, store.limits().max_snapshot_len) {
                    Ok(bytes) => (bytes, Ok(value)),
                    // The business ran: keep the claim as done so repeats never run it again.
                    Err((envelope, e)) => (envelope, Err(err.from_idem(e))),
                };
                match store.complete(req.biz, req.key, attempt, snapshot).await {
                    Ok(()) => (result, acquired_outcome(how)),
                    Err(e @ IdemError::LeaseLost { .. }) => {
                        tracing::error!(
                            attempt,
                            "idempotent call finished after its lease was taken over; result dropped"
                        );
                        (Err(err.from_idem(e)), Outcome::LeaseLost)
                    }
                    Err(e) => {
                        // The business ran but could not be marked: the claim stays PROCESSING and
                        // protects the key until its lease expires.
                        tracing::error!(attempt, error = %e, "idempotent call ran but could not be marked done");
                        (Err(err.from_idem(e)), acquired_outcome(how))
                    }
                }
            }
            Err(body_err) => {
                match store.fail(req.biz, req.key, attempt).await {
                    Ok(()) => {}
                    Err(IdemError::LeaseLost { .. }) => {
                        tracing::warn!(
                            attempt,
                            "failed idempotent call lost its lease; the newer attempt is untouched"
                        );
                    }
                    Err(e) => {
                        tracing::warn!(attempt, error = %e, "could not mark the call FAILED; its lease will expire")
                    }
                }
                (Err(body_err), Outcome::Failed)
            }
        };
        finish_span(outcome, attempt);
        report(biz, outcome, attempt);
        result
    }
    .instrument(span)
    .await
}

/// Where a call's store comes from.
pub enum StoreArg<'a> {
    /// A store registered under this name.
    Named(&'static str),
    /// A store given directly.
    Given(&'a dyn Store),
}

pub(crate) enum StoreHandle<'a> {
    Owned(Arc<dyn Store>),
    Borrowed(&'a dyn Store),
}

impl StoreHandle<'_> {
    pub(crate) fn get(&self) -> &dyn Store {
        match self {
            StoreHandle::Owned(s) => &**s,
            StoreHandle::Borrowed(s) => *s,
        }
    }
}

impl<'a> StoreArg<'a> {
    #[inline]
    pub(crate) fn resolve(self) -> Result<StoreHandle<'a>, IdemError> {
        match self {
            StoreArg::Named(name) => crate::registry::store(name).map(StoreHandle::Owned),
            StoreArg::Given(store) => Ok(StoreHandle::Borrowed(store)),
        }
    }
}

/// Runs a call on a named or given store (what `#[idempotent]` expands to).
///
/// # Errors
/// As [`Call::run`], plus [`IdemError::UnknownStore`] for a name never registered.
#[inline(always)]
pub fn run<'a, T, E, F>(
    store: StoreArg<'a>,
    call: Call,
    ok: OkType<T>,
    err: ErrType<E>,
    body: F,
) -> impl Future<Output = Result<T, E>> + 'a
where
    T: 'a,
    E: 'a,
    F: Future<Output = Result<T, E>> + 'a,
{
    execute(store.resolve(), call, ok, err, body)
}

pub(crate) mod tx {
    //! Transaction mode: claim, business writes and mark in the caller's transaction.

    use super::*;
    use crate::tx::TxConnection;

    /// The claim a transactional call holds while its body runs.
    pub struct TxGuard<'a> {
        store: StoreHandle<'a>,
        call: Call,
        attempt: u32,
        how: Acquired,
    }

    /// What a transactional claim found.
    pub enum TxClaim<'a, T> {
        /// Run the body; finish with [`tx_finish`].
        Run(TxGuard<'a>),
        /// Already done in a committed transaction: this is its result.
        Replay(T),
    }

    /// Claims inside the caller's transaction (a savepoint).
    ///
    /// # Errors
    /// Refusals and store errors as for [`run`]; [`IdemError::TxStoreMismatch`] when the store is
    /// not of the transaction's backend.
    pub async fn tx_claim<'a, T, C>(
        store: StoreArg<'a>,
        call: Call,
        ok: OkType<T>,
        conn: &mut C,
    ) -> Result<TxClaim<'a, T>, IdemError>
    where
        C: TxConnection + ?Sized,
    {
        let refuse = |e: IdemError, outcome: Outcome, biz: &str| {
            report(biz, outcome, 0);
            Err(e)
        };
        let store = match store.resolve() {
            Ok(s) => s,
            Err(e) => return refuse(e, Outcome::Rejected, call.biz()),
        };
        let outcome = match call.request(store.get()) {
            Ok(req) => conn.idem_claim(store.get(), &req).await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(ClaimOutcome::Acquired { attempt, how }) => Ok(TxClaim::Run(TxGuard {
                store,
                call,
                attempt,
                how,
            })),
            Ok(ClaimOutcome::Replay { snapshot }) => match (ok.decode)(&snapshot) {
                Ok(v) => {
                    report(call.biz(), Outcome::Replayed, 0);
                    Ok(TxClaim::Replay(v))
                }
                Err(e) => refuse(e, Outcome::Replayed, call.biz()),
            },
            Ok(ClaimOutcome::Mismatch) => {
                refuse(IdemError::PayloadMismatch, Outcome::Mismatch, call.biz())
            }
            Ok(ClaimOutcome::InProgress { retry_after }) => refuse(
                IdemError::InProgress { retry_after },
                Outcome::InProgress,
                call.biz(),
            ),
            Err(e) => refuse(e, Outcome::Rejected, call.biz()),
        }
    }

    /// Marks the claim done with the body's result (same transaction), or rolls the claim and the
    /// body's writes back to the savepoint when the body failed.
    ///
    /// # Errors
    /// The body's error, or an [`IdemError`] converted into `E`.
    pub async fn tx_finish<T, E, C>(
        guard: TxGuard<'_>,
        conn: &mut C,
        ok: OkType<T>,
        err: ErrType<E>,
        out: Result<T, E>,
    ) -> Result<T, E>
    where
        C: TxConnection + ?Sized,
    {
        let TxGuard {
            store,
            call,
            attempt,
            how,
        } = guard;
        let (result, outcome) = match out {
            Ok(value) => {
                let (snapshot, result) =
                    match (ok.encode)(&value, store.get().limits().max_snapshot_len) {
                        Ok(bytes) => (bytes, Ok(value)),
                        Err((envelope, e)) => (envelope, Err(err.from_idem(e))),
                    };
                match conn
                    .idem_complete(store.get(), call.biz(), call.key(), attempt, &snapshot)
                    .await
                {
                    Ok(()) => (result, acquired_outcome(how)),
                    Err(e @ IdemError::LeaseLost { .. }) => {
                        (Err(err.from_idem(e)), Outcome::LeaseLost)
                    }
                    Err(e) => (Err(err.from_idem(e)), Outcome::Rejected),
                }
            }
            Err(body_err) => {
                if let Err(e) = conn.idem_abort().await {
                    tracing::warn!(error = %e, "could not roll the idempotent claim back to its savepoint");
                }
                (Err(body_err), Outcome::Failed)
            }
        };
        report(call.biz(), outcome, attempt);
        result
    }
}
