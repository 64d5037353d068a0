//! The claim → execute → mark engine behind `#[idempotent]`.
//!
//! [`Call`] (call.rs) says what to claim; [`execute`] runs one call in lease mode; tx.rs runs one
//! inside the caller's transaction; snapshot.rs stores and replays results; current.rs tells the
//! running body which claim it holds. Every mode ends a call through [`report`], so every call
//! gets the same span, counters and report.

mod call;
pub(crate) mod current;
pub(crate) mod retry;
pub(crate) mod snapshot;
pub(crate) mod tx;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

#[cfg(feature = "axum")]
pub(crate) use call::check_durations;
pub use call::{Call, DEFAULT_LEASE, DEFAULT_TTL};
use snapshot::{ErrType, OkType};

use crate::IdemError;
use crate::metrics::{Outcome, report};
use crate::store::{Acquired, Claim, ClaimOutcome, ClaimRequest, Store};

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

/// The `idem` span of one call: `biz`, then `outcome` and `attempt` once it ends. Never the key or
/// the result: keys come from clients and results may be private (tests/observability.rs).
pub(crate) fn call_span(biz: &str) -> tracing::Span {
    tracing::info_span!(
        "idem",
        biz = %biz,
        outcome = tracing::field::Empty,
        attempt = tracing::field::Empty
    )
}

pub(crate) fn acquired_outcome(how: Acquired) -> Outcome {
    match how {
        Acquired::TakeOver => Outcome::TakenOver,
        Acquired::Fresh | Acquired::RetryAfterFailure => Outcome::Executed,
    }
}

/// How many times idem repeats a step that failed with a transient store error (busy, lost
/// connection) where repeating it is safe: a claim, a mark, a renewal.
const TRANSIENT_TRIES: u32 = 4;

/// Sleeps before try number `tried + 1` of a step that hit contention: exponential from 2 ms, with
/// jitter (50–150 %), so callers that collided do not collide again in lockstep.
pub(crate) async fn back_off(tried: u32) {
    let base = 2u64.saturating_mul(1 << tried.min(8)).min(500);
    let jittered = base * 1000 / 2 + fastrand::u64(0..=base * 1000);
    tokio::time::sleep(Duration::from_micros(jittered)).await;
}

/// Runs `step` until it succeeds, fails with an error that is not a transient store error, or has
/// been tried [`TRANSIENT_TRIES`] times.
pub(crate) async fn retry_transient<F, Fut, T>(mut step: F) -> Result<T, IdemError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, IdemError>>,
{
    let mut tried = 0;
    loop {
        match step().await {
            Err(e) if e.is_transient_store_error() && tried + 1 < TRANSIENT_TRIES => {
                tried += 1;
                tracing::debug!(error = %e, tried, "transient store error; trying again");
                back_off(tried).await;
            }
            done => return done,
        }
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
        let started = std::time::Instant::now();
        let outcome = retry_transient(|| store.claim(req)).await;
        crate::metrics::claim_latency(req.biz, store.backend(), started.elapsed());
        let outcome = outcome?;
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

/// Runs the body as the holder of `claim` (see [`current::current_claim`]), renewing the lease
/// every `heartbeat` while it runs.
async fn run_body<F: Future>(
    store: &dyn Store,
    req: &ClaimRequest<'_>,
    claim: Claim,
    heartbeat: Option<Duration>,
    body: F,
) -> F::Output {
    let body = current::scope(claim, body);
    let Some(every) = heartbeat else {
        return body.await;
    };
    let mut body = pin!(body);
    let mut renewing = true;
    loop {
        tokio::select! {
            biased;
            out = &mut body => return out,
            () = tokio::time::sleep(every), if renewing => {
                match retry_transient(|| store.renew(req.biz, req.key, &claim, req.lease)).await {
                    Ok(()) => {}
                    Err(e @ IdemError::LeaseLost { .. }) => {
                        tracing::error!(attempt = claim.attempt, error = %e, "heartbeat found the claim taken over; the result will not be stored");
                        renewing = false;
                    }
                    Err(e) => tracing::warn!(attempt = claim.attempt, error = %e, "heartbeat could not renew the lease; trying again at the next beat"),
                }
            }
        }
    }
}

/// A stored snapshot as the call's answer, and the outcome to count.
fn replayed<T>(ok: OkType<T>, snapshot: &[u8]) -> (Result<T, IdemError>, Outcome) {
    match (ok.decode)(snapshot) {
        Ok(value) => (Ok(value), Outcome::Replayed),
        Err(e @ IdemError::ResultNotStorable { .. }) => (Err(e), Outcome::Unstorable),
        Err(e) => (Err(e), Outcome::Rejected),
    }
}

/// The body's value encoded for storage, the call's answer, and the outcome to count if the mark
/// lands. A result that cannot be stored is replaced by an envelope saying why: the business ran,
/// so the claim is still marked done and repeats get the same error instead of running again.
fn encoded<T, E>(
    ok: OkType<T>,
    err: ErrType<E>,
    value: T,
    limit: usize,
    how: Acquired,
) -> (Vec<u8>, Result<T, E>, Outcome) {
    match (ok.encode)(&value, limit) {
        Ok(bytes) => (bytes, Ok(value), acquired_outcome(how)),
        Err((envelope, e)) => (envelope, Err(err.from_idem(e)), Outcome::Unstorable),
    }
}

/// The one engine path of lease mode: `Call::run` and `#[idempotent]` both end here, so the
/// attribute costs nothing over the hand-written call.
pub(crate) async fn execute<T, E, F>(
    store: Result<StoreHandle<'_>, IdemError>,
    call: Call,
    ok: OkType<T>,
    err: ErrType<E>,
    body: F,
) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
{
    let span = call_span(&call.biz);
    async move {
        let biz = call.biz();
        let refuse = |e: IdemError, outcome: Outcome| {
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
        let (claim, how) = match claim(store, &req, call.wait).await {
            Ok(ClaimOutcome::Acquired { claim, how }) => (claim, how),
            Ok(ClaimOutcome::Replay { snapshot }) => {
                let (result, outcome) = replayed(ok, &snapshot);
                report(biz, outcome, 0);
                return result.map_err(|e| err.from_idem(e));
            }
            Ok(ClaimOutcome::Mismatch) => {
                return refuse(IdemError::PayloadMismatch, Outcome::Mismatch);
            }
            Ok(ClaimOutcome::InProgress { retry_after }) => {
                return refuse(IdemError::InProgress { retry_after }, Outcome::InProgress);
            }
            Err(e) => return refuse(e, Outcome::Rejected),
        };
        // From here the claim is ours. A panic or a dropped future leaves it PROCESSING: the lease
        // expires and a later attempt takes over; nothing ever claims a success that did not happen.
        let out = run_body(store, &req, claim, call.heartbeat, body).await;
        let attempt = claim.attempt;
        let (result, outcome) = match out {
            Ok(value) => {
                let limit = store.limits().max_snapshot_len;
                let (snapshot, result, done) = encoded(ok, err, value, limit, how);
                match retry_transient(|| store.complete(req.biz, req.key, &claim, &snapshot)).await
                {
                    Ok(()) => (result, done),
                    Err(e @ IdemError::LeaseLost { .. }) => {
                        tracing::error!(
                            attempt,
                            "idempotent call finished after its claim was taken over; result dropped"
                        );
                        (Err(err.from_idem(e)), Outcome::LeaseLost)
                    }
                    Err(e) => {
                        // The business ran but could not be marked: the claim stays PROCESSING and
                        // protects the key until its lease expires, then the body may run again.
                        tracing::error!(attempt, error = %e, "idempotent call ran but could not be marked done");
                        (Err(err.from_idem(e)), Outcome::MarkFailed)
                    }
                }
            }
            Err(body_err) => {
                match retry_transient(|| store.fail(req.biz, req.key, &claim)).await {
                    Ok(()) => {}
                    Err(IdemError::LeaseLost { .. }) => tracing::warn!(
                        attempt,
                        "failed idempotent call lost its claim; the newer attempt is untouched"
                    ),
                    Err(e) => tracing::warn!(
                        attempt,
                        error = %e,
                        "could not mark the call FAILED; a retry may run once its lease expires"
                    ),
                }
                (Err(body_err), Outcome::Failed)
            }
        };
        report(biz, outcome, attempt);
        result
    }
    .instrument(span)
    .await
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
