//! `#[idempotent]`'s claim decided before the call's future is made, on a store that answers
//! claims at once (the memory store): a replay or a refusal is the call's answer there and then,
//! so it builds, moves and drops none of the state a call that runs its body needs (the holder,
//! the body, the mark). A claim it acquires goes on to [`run_prepared`] ([`run_recovering`] with a
//! recover fn), which runs the body under it. Every other call (a store to wait for, a claim to
//! wait out, a subscriber that takes the call's span) goes the engine's usual way, unchanged.
//!
//! The attribute calls [`run_now`] where its fn's future is first polled and awaits the prepared
//! run right after, with no await between: nothing can drop a claim taken here before its call
//! holds it.

use super::snapshot::{ErrType, OkType};
use super::{Decided, NoRecover, Settled, StoreArg, StoreHandle, claim_at_once, execute, settle};
use crate::IdemError;
use crate::engine::Call;

/// What [`run_now`] decided for a call.
pub enum Now<'a, T, E> {
    /// The call's answer, counted and reported: a replay or a refusal.
    Answered(Result<T, E>),
    /// The call goes on: give it to [`run_prepared`] with the call.
    Run(Prepared<'a>),
}

/// A call on its way to run: its store, and the claim it holds when the store decided it at once.
pub struct Prepared<'a> {
    store: Result<StoreHandle<'a>, IdemError>,
    decided: Option<Decided>,
}

/// Claims `call` at once where its store answers at once and no subscriber takes the call's span:
/// a replay or a refusal is [`Now::Answered`]; anything else (an acquired claim, or a call that
/// goes the usual way) is [`Now::Run`].
#[inline(always)]
pub fn run_now<'a, T, E>(
    store: StoreArg<'a>,
    call: &Call,
    ok: OkType<T>,
    err: ErrType<E>,
) -> Now<'a, T, E> {
    let handle = match store.resolve() {
        // A subscriber that takes the call's span: the whole call runs in it, its claim too.
        Ok(handle) if !tracing::level_enabled!(tracing::Level::INFO) => handle,
        store => {
            return Now::Run(Prepared {
                store,
                decided: None,
            });
        }
    };
    let mut lent = None;
    let claimed = match call.request(handle.get()) {
        Ok(req) => claim_at_once(
            handle.get(),
            &req,
            call.more().wait.is_some(),
            ok,
            &mut lent,
        ),
        // Refused, and reported, by the usual way.
        Err(_) => None,
    };
    let decided = match claimed {
        None => None,
        Some(claimed) => match settle(&call.biz, claimed, lent, ok, err) {
            Settled::Answer(answer) => return Now::Answered(answer),
            // It came back when it was asked, with its whole lease left.
            Settled::Held(claim, how) => Some((claim, how, tokio::time::Instant::now())),
        },
    };
    Now::Run(Prepared {
        store: Ok(handle),
        decided,
    })
}

/// Runs `call`, which [`run_now`] did not answer: under the claim it took, or the usual way.
#[inline]
pub fn run_prepared<'a, T, E, F>(
    prepared: Prepared<'a>,
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
    let Prepared { store, decided } = prepared;
    execute(
        store,
        call,
        ok,
        err,
        None::<NoRecover<T, E>>,
        None,
        decided,
        body,
    )
}

/// [`run_prepared`] with a recover fn (what `#[idempotent(recover = …)]` expands to): see
/// [`Call::recover`].
///
/// # Errors
/// As [`Call::run`], plus [`IdemError::UnknownStore`] for a name never registered, and the
/// recover fn's own error.
#[inline]
pub fn run_recovering<'a, T, E, F, R, RF>(
    prepared: Prepared<'a>,
    call: Call,
    ok: OkType<T>,
    err: ErrType<E>,
    recover: R,
    body: F,
) -> impl Future<Output = Result<T, E>> + 'a
where
    T: 'a,
    E: 'a,
    F: Future<Output = Result<T, E>> + 'a,
    R: FnOnce() -> RF + 'a,
    RF: Future<Output = Result<Option<T>, E>> + 'a,
{
    let Prepared { store, decided } = prepared;
    execute(store, call, ok, err, Some(recover), None, decided, body)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::store::Acquired;
    use crate::{MemoryStore, TestClock};

    fn decided(now: &Now<'_, String, IdemError>) -> Option<Acquired> {
        match now {
            Now::Run(p) => p.decided.as_ref().map(|(_, how, _)| *how),
            Now::Answered(_) => None,
        }
    }

    /// On the memory store the claim is decided before the call's future: a new key's claim is
    /// held, a claim whose holder died is taken over there and handed to the recover fn (not the
    /// body), and what it found is then replayed at once.
    #[tokio::test]
    async fn a_takeover_decided_at_once_asks_the_recover_fn_and_not_the_body() {
        let clock = TestClock::new();
        let store = MemoryStore::new().with_test_clock(clock.clone());
        let (ok, err) = (OkType::<String>::new(), ErrType::<IdemError>::new());
        let call = || {
            Call::new("PAY", "o-1")
                .lease(Duration::from_secs(1))
                .no_heartbeat()
        };
        let (ran, asked) = (AtomicUsize::new(0), AtomicUsize::new(0));

        // The first holder claims and dies before its body runs: its claim stays PROCESSING.
        let first = run_now(StoreArg::Given(&store), &call(), ok, err);
        assert_eq!(decided(&first), Some(Acquired::Fresh));
        drop(first);
        let refused = run_now(StoreArg::Given(&store), &call(), ok, err);
        assert!(
            matches!(&refused, Now::Answered(Err(IdemError::InProgress { .. }))),
            "a live claim is refused at once"
        );

        clock.advance(Duration::from_secs(2));
        let now = run_now(StoreArg::Given(&store), &call(), ok, err);
        assert_eq!(decided(&now), Some(Acquired::TakeOver));
        let Now::Run(prepared) = now else {
            unreachable!()
        };
        let recover = || async {
            asked.fetch_add(1, Ordering::SeqCst);
            Ok(Some("found".to_owned()))
        };
        let body = async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok("ran again".to_owned())
        };
        let got = run_recovering(prepared, call(), ok, err, recover, body).await;
        assert_eq!(got.unwrap(), "found");
        assert_eq!((asked.into_inner(), ran.into_inner()), (1, 0));

        let replay = run_now(StoreArg::Given(&store), &call(), ok, err);
        assert!(
            matches!(&replay, Now::Answered(Ok(found)) if found == "found"),
            "what recover found is replayed at once"
        );
    }
}
