//! The claim → execute → mark engine behind `#[idempotent]`.
//!
//! [`Call`] (call.rs) says what to claim; [`execute`] runs one call in lease mode; tx.rs runs one
//! inside the caller's transaction; snapshot.rs stores and replays results; current.rs tells the
//! running body which claim it holds. Every mode ends a call through [`report`], so every call
//! gets the same span, counters and report.

mod at_once;
mod batch;
mod call;
pub(crate) mod current;
mod holder;
pub(crate) mod retry;
mod settle;
pub(crate) mod snapshot;
pub(crate) mod steps;
pub(crate) mod tx;
mod within;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use at_once::{Now, run_now, run_prepared, run_recovering};
pub use batch::{Batch, Claimed, ClaimedRecovering};
use batch::{BatchPart, PendingMark};
pub(crate) use batch::{MarkSink, flush_marks};
#[cfg(feature = "axum")]
pub(crate) use call::Heartbeat;
pub(crate) use call::check_durations;
#[cfg(feature = "axum")]
pub(crate) use call::check_result_ttl;
pub(crate) use call::check_store_timeout;
pub use call::with_store_timeout;
pub use call::{Call, DEFAULT_LEASE, DEFAULT_STORE_TIMEOUT, DEFAULT_TTL, Recovering};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use call::{TxStep, tx_step};
use snapshot::{ErrType, OkType};
pub(crate) use within::{
    STORE_TIMEOUT, TRANSIENT_TRIES, Within, after, back_off, back_off_pause, bounded,
    retry_transient,
};

use crate::IdemError;
use crate::metrics::{self, Outcome};
use crate::store::{Acquired, Claim, ClaimOutcome, ClaimRequest, Store};
use current::CallScope;
use holder::Holder;
use settle::{Settled, claim_at_once, refuse, settle};
use steps::Steps;

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
/// the result: keys come from clients and results may be private (tests/tests/observability.rs).
///
/// No span at all (`None`) while no subscriber takes `INFO`: a disabled span still carries its
/// metadata (for the `log` records of tracing's `log` feature, which sqlx turns on), and entering,
/// leaving and recording it cost a replay on the memory store about a sixth of its instructions;
/// even an empty `Span` costs its drop.
#[inline]
pub(crate) fn call_span(biz: &str) -> Option<tracing::Span> {
    if !tracing::level_enabled!(tracing::Level::INFO) {
        return None;
    }
    let span = tracing::info_span!(
        "idem",
        biz = %biz,
        outcome = tracing::field::Empty,
        attempt = tracing::field::Empty
    );
    (!span.is_disabled()).then_some(span)
}

/// Whether a span is a call's own ([`call_span`]).
fn is_call_span(span: &tracing::Metadata<'_>) -> bool {
    span.name() == "idem" && span.target() == module_path!()
}

/// Ends a call: records its outcome in the call's span, counts it and hands it to an enclosing
/// [`observe`](crate::metrics::observe).
pub(crate) fn report(biz: &str, outcome: Outcome, attempt: u32) {
    record_in_span(outcome, attempt);
    metrics::report(biz, outcome, attempt);
}

/// [`report`] for a call that idem's own `error` ended.
pub(crate) fn report_error(biz: &str, outcome: Outcome, attempt: u32, error: &IdemError) {
    record_in_span(outcome, attempt);
    metrics::report_error(biz, outcome, attempt, error);
}

/// Writes a call's outcome (and its attempt, past the first) into its span.
fn record_in_span(outcome: Outcome, attempt: u32) {
    // The call's own span, when there is one: without a subscriber that takes it ([`call_span`])
    // the current span is the caller's, which is not ours to write.
    if tracing::level_enabled!(tracing::Level::INFO)
        && let span = tracing::Span::current()
        && span.metadata().is_some_and(is_call_span)
    {
        span.record("outcome", outcome.as_str());
        if attempt > 0 {
            span.record("attempt", attempt);
        }
    }
}

pub(crate) fn acquired_outcome(how: Acquired) -> Outcome {
    match how {
        Acquired::TakeOver => Outcome::TakenOver,
        Acquired::Fresh | Acquired::RetryAfterFailure => Outcome::Executed,
    }
}

/// Claims, waiting for an in-progress holder when the call allows it; `started` is when the call
/// began. Each round of claiming (with its retries) is cut off after `timeout`. Also returns when
/// the outcome came back (one clock read for the claim's latency and the holder's check that the
/// claim is still inside its lease).
async fn claim(
    store: &dyn Store,
    req: &ClaimRequest<'_>,
    wait: Option<Duration>,
    timeout: Duration,
    mut started: tokio::time::Instant,
) -> Result<(ClaimOutcome, tokio::time::Instant), IdemError> {
    let deadline = wait.map(|w| started + w);
    let mut pause = Duration::from_millis(5);
    loop {
        let until = started.checked_add(timeout);
        let outcome = retry_transient(until, STORE_TIMEOUT, || store.claim(req)).await;
        let now = tokio::time::Instant::now();
        metrics::claim_latency(req.biz, store.backend(), || now - started);
        let outcome = outcome.map_err(|e| e.during("claim"))?;
        let ClaimOutcome::InProgress { retry_after } = outcome else {
            return Ok((outcome, now));
        };
        match deadline {
            Some(deadline) if now < deadline => {
                let nap = pause
                    .min(retry_after.max(Duration::from_millis(1)))
                    .min(deadline - now);
                tokio::time::sleep(nap).await;
                pause = (pause * 2).min(Duration::from_millis(200));
                started = tokio::time::Instant::now();
            }
            _ => return Ok((ClaimOutcome::InProgress { retry_after }, now)),
        }
    }
}

/// A stored snapshot, decoded, as the call's answer, and the outcome to count.
fn replayed<T>(decoded: Result<T, IdemError>) -> (Result<T, IdemError>, Outcome) {
    match decoded {
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
    done: Outcome,
) -> (Vec<u8>, Result<T, E>, Outcome) {
    match (ok.encode)(&value, limit) {
        Ok(bytes) => (bytes, Ok(value), done),
        Err((envelope, e)) => (envelope, Err(err.from_idem(e)), Outcome::Unstorable),
    }
}

/// A call without a recover fn (the type `execute` is given then).
pub(crate) type NoRecover<T, E> = fn() -> std::future::Ready<Result<Option<T>, E>>;

/// The one engine path of lease mode: `Call::run` and `#[idempotent]` both end here, so the
/// attribute costs nothing over the hand-written call.
///
/// With a `recover` fn, a takeover (a PROCESSING record whose lease ended: its holder died, or its
/// mark never landed, possibly after the body's effect) asks it first whether the action already
/// happened: `Some(value)` is stored as the success (under the new claim's fence) and returned, and
/// the body does not run; `None` runs the body; an error releases the claim (the record stays
/// PROCESSING with its lease ended, so the next call asks again) and is the call's answer.
///
/// The call's span is made here, when the call is, and the call runs in it (bare when no
/// subscriber takes it): one future, not one inside another.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn execute<T, E, F, R, RF>(
    store: Result<StoreHandle<'_>, IdemError>,
    call: Call,
    ok: OkType<T>,
    err: ErrType<E>,
    recover: Option<R>,
    part: Option<Box<BatchPart>>,
    decided: Option<Decided>,
    body: F,
) -> InSpan<impl Future<Output = Result<T, E>>>
where
    F: Future<Output = Result<T, E>>,
    R: FnOnce() -> RF,
    RF: Future<Output = Result<Option<T>, E>>,
{
    in_span(
        call_span(&call.biz),
        execute_bare(store, call, ok, err, recover, part, decided, body),
    )
}

/// A claim a call holds, decided at once before its future was made ([`run_now`]), and when it
/// came back by this process's clock.
type Decided = (Claim, Acquired, tokio::time::Instant);

/// [`execute`] without its span. `decided`: the claim this call already holds, decided at once
/// by [`run_now`] (its request checked then).
#[allow(clippy::too_many_arguments)]
async fn execute_bare<T, E, F, R, RF>(
    store: Result<StoreHandle<'_>, IdemError>,
    mut call: Call,
    ok: OkType<T>,
    err: ErrType<E>,
    recover: Option<R>,
    part: Option<Box<BatchPart>>,
    decided: Option<Decided>,
    body: F,
) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
    R: FnOnce() -> RF,
    RF: Future<Output = Result<Option<T>, E>>,
{
    let biz: &str = &call.biz;
    let handle = match store {
        Ok(handle) => handle,
        Err(e) => return refuse(biz, e, Outcome::Rejected, err),
    };
    let store = handle.get();
    let kept = call.result_kept();
    // Boxed: a call outside a batch carries one word for it, not the claim's outcome.
    let (prefetched, defer) = match part {
        Some(part) => {
            let BatchPart { prefetched, defer } = *part;
            (prefetched, defer)
        }
        None => (None, None),
    };
    let (claim, how, claimed_at, answered) = match decided {
        Some((claim, how, claimed_at)) => (claim, how, claimed_at, None),
        None => {
            let req = match call.request(store) {
                Ok(req) => req,
                Err(e) => return refuse(biz, e, Outcome::Rejected, err),
            };
            let waits = call.more().wait.is_some();
            // The outcome, and when the claim was sent and came back by this process's clock
            // (the holder counts its lease from the first and checks it as of the second);
            // `None` for a claim decided at once in this process, whose times are read only if
            // it is ours. A replay's result lent by a store that holds it is decoded where it
            // is kept instead of copied out first.
            let mut lent: Option<Result<T, IdemError>> = None;
            let (claimed, times) = match prefetched {
                // Decided by a batch claim (a waiting call claims again while it is in
                // progress): the lease is counted from when that claim was sent, and checked as
                // of now.
                Some(p) if !(waits && matches!(p.outcome, ClaimOutcome::InProgress { .. })) => {
                    (Ok(p.outcome), Some((p.sent, tokio::time::Instant::now())))
                }
                _ => match claim_at_once(store, &req, waits, ok, &mut lent) {
                    Some(claimed) => (claimed, None),
                    // The claim loop, with its retries, timeout and back-off.
                    None => {
                        let sent = tokio::time::Instant::now();
                        let timeout = call.store_timeout_in_force();
                        match claim(store, &req, call.more().wait, timeout, sent).await {
                            Ok((outcome, answered)) => (Ok(outcome), Some((sent, answered))),
                            Err(e) => (Err(e), None),
                        }
                    }
                },
            };
            match settle(biz, claimed, lent, ok, err) {
                Settled::Answer(answer) => return answer,
                Settled::Held(claim, how) => match times {
                    Some((sent, answered)) => (claim, how, sent, Some(answered)),
                    None => (claim, how, tokio::time::Instant::now(), None),
                },
            }
        }
    };
    // From here the claim is ours. A panic or a dropped future leaves it PROCESSING: the lease
    // expires and a later attempt takes over; nothing ever claims a success that did not happen.
    // What the body's task knows of its call (for its steps): made only once the body may
    // run, so a replay allocates nothing for it.
    // The call's key moves into it (the call keeps no other use for it), and the request
    // reads it there.
    let fingerprint = match call.more.as_deref().map(|more| &more.fingerprint) {
        Some(Some(Ok(fp))) => Some(fp.as_str()),
        _ => None,
    };
    let scope = Arc::new(CallScope::new(
        call.biz.clone(),
        std::mem::take(&mut call.key),
        Some(Steps::new(how == Acquired::Fresh)),
    ));
    let req = ClaimRequest {
        biz,
        key: &scope.key,
        fingerprint,
        lease: call.lease,
        ttl: call.ttl,
    };
    let timeout = call.store_timeout_in_force();
    let mut holder = Holder::new(
        store,
        &req,
        claim,
        Arc::clone(&scope),
        call.heartbeat_every(),
        timeout,
        claimed_at,
    );
    let attempt = claim.attempt;
    if let Some(answered) = answered
        && let Err(e) = holder.confirm_at(answered).await
    {
        // The claim came back too late to be sure it is still ours: nothing runs.
        let outcome = match e {
            IdemError::LeaseLost { .. } => Outcome::LeaseLost,
            _ => Outcome::Rejected,
        };
        tracing::warn!(attempt, error = %e, "the claim came back after its lease; nothing ran");
        report_error(biz, outcome, attempt, &e);
        return Err(err.from_idem(e));
    }
    let recovered = match recover {
        Some(recover) if how == Acquired::TakeOver => match holder.run(recover()).await {
            Ok(found) => found,
            Err(recover_err) => {
                if let Err(e) = holder
                    .finish(|| store.release(req.biz, req.key, &claim))
                    .await
                    .map_err(|e| e.during("release"))
                {
                    tracing::warn!(attempt, error = %e, "could not release the claim after recover failed; it is taken over once its lease ends");
                }
                report(biz, Outcome::RecoverFailed, attempt);
                return Err(recover_err);
            }
        },
        _ => None,
    };
    let (out, ran) = match recovered {
        Some(value) => (Ok(value), Outcome::Recovered),
        None => (holder.run(body).await, acquired_outcome(how)),
    };
    let (result, outcome) = match out {
        Ok(value) => {
            let limit = store.limits().max_snapshot_len;
            let (mut snapshot, result, done) = encoded(ok, err, value, limit, ran);
            if let Some(defer) = defer
                && result.is_ok()
            {
                // The batch sends this mark with the others' and reports the call once it
                // landed (`Inbox::handle_batch`).
                defer.push(PendingMark {
                    biz: biz.to_owned(),
                    key: req.key.to_owned(),
                    claim,
                    snapshot,
                    ttl: req.ttl,
                    result_ttl: kept,
                    done,
                    lease_sent: holder.lease_sent(),
                    lease: req.lease,
                });
                return result;
            }
            let marked =
                match store.complete_now(req.biz, req.key, &claim, &mut snapshot, req.ttl, kept) {
                    // Done in this process; a transient error (none of this crate's stores
                    // gives one here) is tried again as any mark is.
                    Some(done) if !matches!(&done, Err(e) if e.is_transient_store_error()) => done,
                    _ => {
                        holder
                            .finish(|| match kept {
                                None => {
                                    store.complete(req.biz, req.key, &claim, &snapshot, req.ttl)
                                }
                                Some(kept) => store.complete_keeping(
                                    req.biz, req.key, &claim, &snapshot, req.ttl, kept,
                                ),
                            })
                            .await
                    }
                };
            match marked.map_err(|e| e.during("mark")) {
                Ok(()) => (result, done),
                Err(e @ IdemError::LeaseLost { .. }) => {
                    tracing::error!(
                        attempt,
                        "idempotent call finished after its claim was taken over; result dropped"
                    );
                    (Err(err.from_idem(e)), Outcome::LeaseLost)
                }
                Err(e) => {
                    // The business ran but could not be marked while the lease was live: the
                    // claim stays PROCESSING and protects the key until its lease expires,
                    // then the body may run again (or recover finds its effect).
                    tracing::error!(attempt, error = %e, "idempotent call ran but could not be marked done within its lease");
                    (Err(err.from_idem(e)), Outcome::MarkFailed)
                }
            }
        }
        Err(body_err) => {
            match holder
                .finish(|| store.fail(req.biz, req.key, &claim))
                .await
                .map_err(|e| e.during("mark"))
            {
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

pin_project_lite::pin_project! {
    /// A call's future in its span, entered on every poll as `tracing::Instrumented` does, or
    /// bare when the span is disabled (no subscriber takes it): then the call pays nothing for it,
    /// not even entering and leaving a span that is not there.
    pub(crate) struct InSpan<F> {
        #[pin]
        fut: F,
        span: Option<tracing::Span>,
    }
}

impl<F: Future> Future for InSpan<F> {
    type Output = F::Output;

    #[inline]
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let this = self.project();
        match this.span {
            Some(span) => {
                let _entered = span.enter();
                this.fut.poll(cx)
            }
            None => this.fut.poll(cx),
        }
    }
}

/// `fut` inside `span` ([`InSpan`]; bare for `None`, as [`call_span`] gives when disabled).
#[inline(always)]
pub(crate) fn in_span<F: Future>(span: Option<tracing::Span>, fut: F) -> InSpan<F> {
    InSpan { fut, span }
}
