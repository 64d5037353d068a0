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
mod lease;
pub(crate) mod retry;
mod settle;
pub(crate) mod snapshot;
mod step_log;
pub(crate) mod steps;
pub(crate) mod tx;
mod within;

use std::future::Future;
use std::sync::Arc;

pub use at_once::{Now, run_now, run_prepared, run_recovering};
pub use batch::{Batch, Claimed, ClaimedRecovering};
pub(crate) use batch::{MarkSink, flush_marks};
#[cfg(feature = "layer-core")]
pub(crate) use call::Heartbeat;
pub(crate) use call::check_durations;
#[cfg(feature = "layer-core")]
pub(crate) use call::check_result_ttl;
pub(crate) use call::check_store_timeout;
pub use call::with_store_timeout;
pub use call::{Call, DEFAULT_LEASE, DEFAULT_STORE_TIMEOUT, DEFAULT_TTL, Recovering};
// Every SQL transaction (`sql/tx.rs`), though only the server databases' bound their steps.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) use call::{TxStep, tx_step};
use lease::Decided;
pub(crate) use lease::{NoRecover, execute};
use snapshot::{ErrType, OkType};
pub(crate) use within::{
    STORE_TIMEOUT, TRANSIENT_TRIES, Within, after, back_off, back_off_pause, bounded,
    retry_transient,
};

use crate::IdemError;
use crate::metrics::{self, Outcome};
use crate::store::{Acquired, Store};
use settle::{Settled, claim_at_once, settle};

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
#[inline(always)]
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
