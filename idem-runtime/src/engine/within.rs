//! How a store step is bounded in time and tried again: a step cut off at a moment (`Within`,
//! `within`, `bounded`), and transient store errors tried again with back-off within it
//! (`retry_transient`).

use std::future::Future;
use std::time::Duration;

use crate::IdemError;

/// How many times idem repeats a step that failed with a transient store error (busy, lost
/// connection) where repeating it is safe: a claim, a mark, a renewal.
pub(crate) const TRANSIENT_TRIES: u32 = 4;

pub(crate) use crate::backoff::{back_off, back_off_pause};

/// Runs `step` until it succeeds, fails with an error that is not a transient store error, or has
/// been tried [`TRANSIENT_TRIES`] times; all of it by `until` (when given): each try is cut off
/// then ([`Within`]), and a pause that would end past it is not taken (the last error is the
/// answer). `why` names what `until` is.
pub(crate) async fn retry_transient<F, Fut, T>(
    until: Option<tokio::time::Instant>,
    why: &'static str,
    mut step: F,
) -> Result<T, IdemError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, IdemError>> + Unpin,
{
    let mut tried = 0;
    loop {
        match Within::new(until, why, step()).await {
            Err(e) if e.is_transient_store_error() && tried + 1 < TRANSIENT_TRIES => {
                tried += 1;
                let pause = back_off_pause(tried);
                if until.is_some_and(|until| tokio::time::Instant::now() + pause >= until) {
                    return Err(e);
                }
                tracing::debug!(error = %e, tried, "transient store error; trying again");
                // Boxed: the pause is rare, and the step's future stays small without it.
                Box::pin(tokio::time::sleep(pause)).await;
            }
            done => return done,
        }
    }
}

/// A store step (an `Unpin` future: the stores' boxed ones) cut off at `until` (when given) with
/// [`IdemError::StoreUnavailable`] saying what ran out (`why`). The timer is made only once the
/// step has to wait, and boxed: a step done at its first poll (an in-process store) costs no
/// timer, and the future stays two words larger than the step's.
pub(crate) struct Within<F> {
    step: F,
    until: Option<tokio::time::Instant>,
    why: &'static str,
    timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<F> Within<F> {
    pub(crate) fn new(until: Option<tokio::time::Instant>, why: &'static str, step: F) -> Self {
        Within {
            step,
            until,
            why,
            timer: None,
        }
    }
}

impl<T, F: Future<Output = Result<T, IdemError>> + Unpin> Future for Within<F> {
    type Output = Result<T, IdemError>;

    #[inline]
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = &mut *self;
        if let std::task::Poll::Ready(done) = std::pin::Pin::new(&mut this.step).poll(cx) {
            return std::task::Poll::Ready(done);
        }
        let Some(until) = this.until else {
            return std::task::Poll::Pending;
        };
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
        timer.as_mut().poll(cx).map(|()| Err(no_answer(this.why)))
    }
}

/// Any step (a transaction's, the HTTP layer's) cut off as [`Within`] cuts a store's.
pub(super) async fn within<T, F: Future<Output = Result<T, IdemError>>>(
    until: Option<tokio::time::Instant>,
    why: &'static str,
    step: F,
) -> Result<T, IdemError> {
    let Some(until) = until else {
        return step.await;
    };
    let mut step = std::pin::pin!(step);
    let mut timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(done) = step.as_mut().poll(cx) {
            return std::task::Poll::Ready(done);
        }
        let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
        timer.as_mut().poll(cx).map(|()| Err(no_answer(why)))
    })
    .await
}

/// `step` within `timeout` from now, as a call's store timeout bounds it.
pub(crate) fn bounded<T, F: Future<Output = Result<T, IdemError>>>(
    timeout: Duration,
    step: F,
) -> impl Future<Output = Result<T, IdemError>> {
    within(after(timeout), STORE_TIMEOUT, step)
}

/// The error of a store step that did not answer before `why` ran out.
pub(super) fn no_answer(why: &str) -> IdemError {
    IdemError::unavailable(format!(
        "the store did not answer within {why} (a network gone silent, or a server that hangs); \
         nothing is known to have changed, try again"
    ))
}

/// The moment `timeout` from now, if the clock can hold it.
pub(crate) fn after(timeout: Duration) -> Option<tokio::time::Instant> {
    tokio::time::Instant::now().checked_add(timeout)
}

/// What a cut-off step's error names as having run out.
pub(crate) const STORE_TIMEOUT: &str = "the call's store timeout";
