//! The claim → execute → mark engine behind `#[idempotent]`.
//!
//! [`Call`] (call.rs) says what to claim; [`execute`] runs one call; snapshot.rs stores and replays
//! results; tx.rs runs a call inside the caller's transaction.

mod call;
pub(crate) mod snapshot;
pub(crate) mod tx;
pub(crate) mod tx_conn;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

pub use call::{Call, DEFAULT_LEASE, DEFAULT_TTL};
use snapshot::{ErrType, OkType};

use crate::IdemError;
use crate::metrics::{Outcome, report};
use crate::store::{Acquired, ClaimOutcome, ClaimRequest, Store};

fn finish_span(outcome: Outcome, attempt: u32) {
    let span = tracing::Span::current();
    span.record("outcome", outcome.as_str());
    if attempt > 0 {
        span.record("attempt", attempt);
    }
}

pub(crate) fn acquired_outcome(how: Acquired) -> Outcome {
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
