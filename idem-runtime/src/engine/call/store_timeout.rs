//! The store timeout in force for a scope ([`with_store_timeout`]), and the bound it puts on each
//! step of a store's own transaction.

use std::future::Future;
use std::time::Duration;

use super::DEFAULT_STORE_TIMEOUT;

tokio::task_local! {
    /// The store timeout of the calls made inside [`with_store_timeout`] that set none.
    static AMBIENT_STORE_TIMEOUT: Duration;
}

/// Runs `fut` with `timeout` as the store timeout in force inside it: the store timeout of every
/// call made in it that sets none of its own
/// ([`Call::store_timeout`](crate::Call::store_timeout)), and the bound on each begin, commit
/// and rollback of a store's transaction (`PgStore::begin`, `PgTx::commit`, …).
/// Outside any such scope the store timeout is [`DEFAULT_STORE_TIMEOUT`]; an inbox runs its
/// handlers in the scope of its own. `timeout` is 1 ms ..= [`MAX_DURATION`](crate::MAX_DURATION);
/// one out of range is taken as the nearest bound.
///
/// ```
/// # use idem_runtime as idem;
/// # async fn demo(store: &idem::SqliteStore) -> Result<(), idem::IdemError> {
/// use std::time::Duration;
/// idem::store::with_store_timeout(Duration::from_secs(1), async {
///     let tx = store.begin().await?;
///     // … the call and the business writes in `tx` …
///     tx.commit().await
/// })
/// .await
/// # }
/// ```
pub async fn with_store_timeout<F: Future>(timeout: Duration, fut: F) -> F::Output {
    let timeout = timeout.clamp(Duration::from_millis(1), crate::MAX_DURATION);
    AMBIENT_STORE_TIMEOUT.scope(timeout, fut).await
}

/// Which step of a store transaction a bound cut off.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxStep {
    /// The `BEGIN` (SQLite's is not bounded: its busy timeout bounds the wait for the lock).
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    Begin,
    /// A statement run through the transaction
    /// ([`TransitionConn::execute`](crate::state_machine::TransitionConn::execute), …).
    Statement,
    Commit,
    Rollback,
}

/// A store transaction's `step` within the store timeout in force ([`with_store_timeout`], or
/// [`DEFAULT_STORE_TIMEOUT`]): past it, a retryable [`IdemError::StoreUnavailable`] that says
/// what is known. The connection goes back to its pool, which tests it before anyone uses it
/// again.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) async fn tx_step<T, E>(
    step: TxStep,
    fut: impl Future<Output = Result<T, E>>,
    error: impl FnOnce(E) -> crate::IdemError,
) -> Result<T, crate::IdemError> {
    let timeout = ambient_store_timeout();
    match tokio::time::timeout(timeout, fut).await {
        Ok(done) => done.map_err(error),
        Err(_) => Err(crate::IdemError::unavailable(format!(
            "the store did not answer the transaction's {} within the store timeout ({timeout:?}): {}",
            match step {
                TxStep::Begin => "BEGIN",
                TxStep::Statement => "statement",
                TxStep::Commit => "COMMIT",
                TxStep::Rollback => "ROLLBACK",
            },
            match step {
                TxStep::Commit =>
                    "it may or may not have committed; a repeat of the call replays if it did, and runs if it did not",
                TxStep::Begin => "nothing was written, try again",
                TxStep::Statement =>
                    "roll the transaction back and try again; nothing it wrote is kept",
                TxStep::Rollback =>
                    "nothing it wrote is kept (the server rolls back a transaction whose connection ends)",
            }
        ))),
    }
}

/// The store timeout a new call starts with: the surrounding [`with_store_timeout`]'s, or
/// [`DEFAULT_STORE_TIMEOUT`].
pub(super) fn ambient_store_timeout() -> Duration {
    AMBIENT_STORE_TIMEOUT
        .try_with(|timeout| *timeout)
        .unwrap_or(DEFAULT_STORE_TIMEOUT)
}
