//! A claim's outcome as far as its call goes: asked at once of a store that answers at once, then
//! settled into the call's answer (a replay or a refusal, counted and reported) or the claim the
//! call holds. Shared by the engine's path and by `#[idempotent]`'s claim made before the call's
//! future (`at_once.rs`).

use std::time::Duration;

use super::snapshot::{ErrType, OkType};
use super::{replayed, report, report_error};
use crate::IdemError;
use crate::metrics::{self, Outcome};
use crate::store::{Acquired, Claim, ClaimOutcome, ClaimRequest, Store};

/// A claim's outcome as far as the call goes: its answer (a replay or a refusal, reported), or the
/// claim it holds and runs under.
pub(super) enum Settled<T, E> {
    Answer(Result<T, E>),
    Held(Claim, Acquired),
}

/// Settles `claimed` for the call of `biz`: a replay is decoded (from `lent`, the result a store
/// lent while it held it, else from the outcome's snapshot), a refusal or an error becomes the
/// call's error; each is counted and reported. An acquired claim is the call's to hold.
#[inline(always)]
pub(super) fn settle<T, E>(
    biz: &str,
    claimed: Result<ClaimOutcome, IdemError>,
    lent: Option<Result<T, IdemError>>,
    ok: OkType<T>,
    err: ErrType<E>,
) -> Settled<T, E> {
    let refused = match claimed {
        Ok(ClaimOutcome::Acquired { claim, how }) => return Settled::Held(claim, how),
        Ok(ClaimOutcome::Replay { snapshot }) => {
            let (result, outcome) = replayed(lent.unwrap_or_else(|| (ok.decode)(&snapshot)));
            match &result {
                Ok(_) => report(biz, outcome, 0),
                Err(e) => report_error(biz, outcome, 0, e),
            }
            return Settled::Answer(result.map_err(|e| err.from_idem(e)));
        }
        Ok(ClaimOutcome::Mismatch) => (IdemError::PayloadMismatch, Outcome::Mismatch),
        Ok(ClaimOutcome::ResultGone) => (IdemError::ResultExpired, Outcome::ResultExpired),
        Ok(ClaimOutcome::InProgress { retry_after }) => {
            (IdemError::InProgress { retry_after }, Outcome::InProgress)
        }
        Err(e) => (e, Outcome::Rejected),
    };
    Settled::Answer(refuse(biz, refused.0, refused.1, err))
}

/// `e` as the call's answer, counted and reported as `outcome`.
pub(super) fn refuse<T, E>(
    biz: &str,
    e: IdemError,
    outcome: Outcome,
    err: ErrType<E>,
) -> Result<T, E> {
    report_error(biz, outcome, 0, &e);
    Err(err.from_idem(e))
}

/// The claim of `req` answered at once by a store that holds its records in this process
/// ([`Store::__claim_now_lending`]), a replay's result decoded into `lent` where the store keeps
/// it. `None` when the call has to go through the claim loop: a store to wait for, a transient
/// error, or a holder in progress that this call waits out (`waits`).
#[inline(always)]
pub(super) fn claim_at_once<T>(
    store: &dyn Store,
    req: &ClaimRequest<'_>,
    waits: bool,
    ok: OkType<T>,
    lent: &mut Option<Result<T, IdemError>>,
) -> Option<Result<ClaimOutcome, IdemError>> {
    match store.__claim_now_lending(req, &mut |stored| *lent = Some((ok.decode)(stored))) {
        Some(Ok(ClaimOutcome::InProgress { .. })) if waits => None,
        Some(Ok(outcome)) => {
            if metrics::ENABLED {
                metrics::claim_latency(req.biz, store.backend(), || Duration::ZERO);
            }
            Some(Ok(outcome))
        }
        Some(Err(e)) if !e.is_transient_store_error() => Some(Err(e.during("claim"))),
        _ => None,
    }
}
