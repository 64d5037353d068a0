//! Lease mode's one path, as named steps: the claim ([`claim_step`], with the claim loop
//! [`claim`]), the hold (a [`Holder`] renews the lease while anything runs under it), the run
//! ([`run_step`]: recover on a takeover, else the body), and the mark ([`mark_step`], or
//! [`fail_step`] after the body's error).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::batch::{BatchPart, Deferred, PendingMark, Prefetched};
use super::current::CallScope;
use super::holder::Holder;
use super::settle::{Settled, claim_at_once, refuse, settle};
use super::snapshot::{ErrType, OkType};
use super::step_log::Steps;
use super::{
    Call, InSpan, STORE_TIMEOUT, StoreHandle, acquired_outcome, call_span, encoded, in_span,
    report, report_error, retry_transient,
};
use crate::IdemError;
use crate::metrics::{self, Outcome};
use crate::store::{Acquired, Claim, ClaimOutcome, ClaimRequest, Store};

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
pub(super) type Decided = (Claim, Acquired, tokio::time::Instant);

/// What the claim step leaves a call whose body may run: its claim, how it came about, when it
/// was sent (the holder counts its lease from then), and when it came back (`None` for a claim
/// decided at once in this process, which needs no check that it is still inside its lease).
struct Taken {
    claim: Claim,
    how: Acquired,
    sent: tokio::time::Instant,
    answered: Option<tokio::time::Instant>,
}

/// [`execute`] without its span: claim, hold, run, mark. `decided`: the claim this call already
/// holds, decided at once by [`run_now`](super::run_now) (its request checked then).
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
    let taken = match decided {
        Some((claim, how, sent)) => Taken {
            claim,
            how,
            sent,
            answered: None,
        },
        None => match claim_step(store, &call, prefetched, ok, err).await {
            Ok(taken) => taken,
            Err(answer) => return answer,
        },
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
        Some(Steps::new(taken.how == Acquired::Fresh)),
    ));
    let req = ClaimRequest {
        biz,
        key: &scope.key,
        fingerprint,
        lease: call.lease,
        ttl: call.ttl,
    };
    let mut holder = Holder::new(
        store,
        &req,
        taken.claim,
        Arc::clone(&scope),
        call.heartbeat_every(),
        call.store_timeout_in_force(),
        taken.sent,
    );
    let attempt = taken.claim.attempt;
    if let Some(answered) = taken.answered
        && let Err(e) = holder.confirm_at(answered).await
    {
        return too_late(biz, attempt, e, err);
    }
    let (out, ran) = match run_step(&mut holder, store, &req, &taken, recover, body).await {
        Ok(ran) => ran,
        Err(answer) => return answer,
    };
    let value = match out {
        Ok(value) => value,
        Err(body_err) => {
            fail_step(&mut holder, store, &req, &taken.claim).await;
            report(biz, Outcome::Failed, attempt);
            return Err(body_err);
        }
    };
    let limit = store.limits().max_snapshot_len;
    let (snapshot, result, done) = encoded(ok, err, value, limit, ran);
    let Some(snapshot) = deferred(
        defer,
        &holder,
        &req,
        &taken.claim,
        snapshot,
        &result,
        done,
        kept,
    ) else {
        return result;
    };
    let mut snapshot = snapshot;
    let marked = match mark_now(store, &req, &taken.claim, &mut snapshot, kept) {
        Some(done) => done,
        None => mark_step(&mut holder, store, &req, &taken.claim, &snapshot, kept).await,
    }
    .map_err(|e| e.during("mark"));
    let (result, outcome) = answer_marked(marked, result, done, err, attempt);
    report(biz, outcome, attempt);
    result
}

/// The answer of a claim that came back too late to be sure it is still ours: nothing ran.
#[cold]
fn too_late<T, E>(biz: &str, attempt: u32, e: IdemError, err: ErrType<E>) -> Result<T, E> {
    let outcome = match e {
        IdemError::LeaseLost { .. } => Outcome::LeaseLost,
        _ => Outcome::Rejected,
    };
    tracing::warn!(attempt, error = %e, "the claim came back after its lease; nothing ran");
    report_error(biz, outcome, attempt, &e);
    Err(err.from_idem(e))
}

/// A success whose mark its batch sends with the others' (`Inbox::handle_batch`, which reports
/// the call once it landed): `None` once handed over; otherwise the snapshot, to mark now.
/// (Plain functions around the mark, not a future of their own: a first execution on the memory
/// store would pay about 200 instructions for one more.)
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn deferred<T, E>(
    defer: Option<Deferred>,
    holder: &Holder<'_>,
    req: &ClaimRequest<'_>,
    claim: &Claim,
    snapshot: Vec<u8>,
    result: &Result<T, E>,
    done: Outcome,
    kept: Option<Duration>,
) -> Option<Vec<u8>> {
    match defer {
        Some(defer) if result.is_ok() => {
            defer.push(PendingMark {
                biz: req.biz.to_owned(),
                key: req.key.to_owned(),
                claim: *claim,
                snapshot,
                ttl: req.ttl,
                result_ttl: kept,
                done,
                lease_sent: holder.lease_sent(),
                lease: req.lease,
            });
            None
        }
        _ => Some(snapshot),
    }
}

/// The call's answer and the outcome to count once its mark was sent: `result` when it landed.
#[inline(always)]
fn answer_marked<T, E>(
    marked: Result<(), IdemError>,
    result: Result<T, E>,
    done: Outcome,
    err: ErrType<E>,
    attempt: u32,
) -> (Result<T, E>, Outcome) {
    match marked {
        Ok(()) => (result, done),
        Err(e @ IdemError::LeaseLost { .. }) => {
            tracing::error!(
                attempt,
                "idempotent call finished after its claim was taken over; result dropped"
            );
            (Err(err.from_idem(e)), Outcome::LeaseLost)
        }
        Err(e) => {
            // The business ran but could not be marked while the lease was live: the claim
            // stays PROCESSING and protects the key until its lease expires, then the body may
            // run again (or recover finds its effect).
            tracing::error!(attempt, error = %e, "idempotent call ran but could not be marked done within its lease");
            (Err(err.from_idem(e)), Outcome::MarkFailed)
        }
    }
}

/// The claim: decided by a batch claim (`prefetched`), at once by a store that holds its records
/// in this process, or by the claim loop with its retries, timeout and back-off. `Err` is the
/// call's answer (a replay, a refusal, an error), already reported.
async fn claim_step<T, E>(
    store: &dyn Store,
    call: &Call,
    prefetched: Option<Prefetched>,
    ok: OkType<T>,
    err: ErrType<E>,
) -> Result<Taken, Result<T, E>> {
    let biz: &str = &call.biz;
    let req = call
        .request(store)
        .map_err(|e| refuse(biz, e, Outcome::Rejected, err))?;
    let waits = call.more().wait.is_some();
    // The outcome, and when the claim was sent and came back by this process's clock (the holder
    // counts its lease from the first and checks it as of the second); `None` for a claim decided
    // at once in this process, whose times are read only if it is ours. A replay's result lent by
    // a store that holds it is decoded where it is kept instead of copied out first.
    let mut lent: Option<Result<T, IdemError>> = None;
    let (claimed, times) = match prefetched {
        // Decided by a batch claim (a waiting call claims again while it is in progress): the
        // lease is counted from when that claim was sent, and checked as of now.
        Some(p) if !(waits && matches!(p.outcome, ClaimOutcome::InProgress { .. })) => {
            (Ok(p.outcome), Some((p.sent, tokio::time::Instant::now())))
        }
        _ => match claim_at_once(store, &req, waits, ok, &mut lent) {
            Some(claimed) => (claimed, None),
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
        Settled::Answer(answer) => Err(answer),
        Settled::Held(claim, how) => Ok(match times {
            Some((sent, answered)) => Taken {
                claim,
                how,
                sent,
                answered: Some(answered),
            },
            None => Taken {
                claim,
                how,
                sent: tokio::time::Instant::now(),
                answered: None,
            },
        }),
    }
}

/// Runs the call while the holder renews its lease: a takeover with a `recover` fn asks it first
/// (its `Some` is the result, and the body does not run); otherwise the body. The result, and the
/// outcome to count if it is marked. `Err` is the call's answer when recover failed (the claim
/// released, so the next call asks again), already reported.
async fn run_step<T, E, F, R, RF>(
    holder: &mut Holder<'_>,
    store: &dyn Store,
    req: &ClaimRequest<'_>,
    taken: &Taken,
    recover: Option<R>,
    body: F,
) -> Result<(Result<T, E>, Outcome), Result<T, E>>
where
    F: Future<Output = Result<T, E>>,
    R: FnOnce() -> RF,
    RF: Future<Output = Result<Option<T>, E>>,
{
    let attempt = taken.claim.attempt;
    let recovered = match recover {
        Some(recover) if taken.how == Acquired::TakeOver => match holder.run(recover()).await {
            Ok(found) => found,
            Err(recover_err) => {
                if let Err(e) = holder
                    .finish(|| store.release(req.biz, req.key, &taken.claim))
                    .await
                    .map_err(|e| e.during("release"))
                {
                    tracing::warn!(attempt, error = %e, "could not release the claim after recover failed; it is taken over once its lease ends");
                }
                report(req.biz, Outcome::RecoverFailed, attempt);
                return Err(Err(recover_err));
            }
        },
        _ => None,
    };
    Ok(match recovered {
        Some(value) => (Ok(value), Outcome::Recovered),
        None => (holder.run(body).await, acquired_outcome(taken.how)),
    })
}

/// The mark answered at once by a store that holds its records in this process (`None`: send it
/// with [`mark_step`]). A transient error (none of this crate's stores gives one here) is tried
/// again as any mark is.
#[inline(always)]
fn mark_now(
    store: &dyn Store,
    req: &ClaimRequest<'_>,
    claim: &Claim,
    snapshot: &mut Vec<u8>,
    kept: Option<Duration>,
) -> Option<Result<(), IdemError>> {
    store
        .__complete_now(req.biz, req.key, claim, snapshot, req.ttl, kept)
        .filter(|done| !matches!(done, Err(e) if e.is_transient_store_error()))
}

/// Marks the claim done with `snapshot` (kept for replay `kept` when given) while the holder
/// keeps the lease.
async fn mark_step(
    holder: &mut Holder<'_>,
    store: &dyn Store,
    req: &ClaimRequest<'_>,
    claim: &Claim,
    snapshot: &[u8],
    kept: Option<Duration>,
) -> Result<(), IdemError> {
    holder
        .finish(|| match kept {
            None => store.complete(req.biz, req.key, claim, snapshot, req.ttl),
            Some(kept) => store.complete_keeping(req.biz, req.key, claim, snapshot, req.ttl, kept),
        })
        .await
}

/// Marks the claim FAILED after the body's error, so a retry may run at once; a claim lost
/// meanwhile is left to the newer attempt.
async fn fail_step(
    holder: &mut Holder<'_>,
    store: &dyn Store,
    req: &ClaimRequest<'_>,
    claim: &Claim,
) {
    let attempt = claim.attempt;
    match holder
        .finish(|| store.fail(req.biz, req.key, claim))
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
