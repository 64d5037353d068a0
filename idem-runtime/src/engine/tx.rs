//! Transaction mode (`tx = "…"`): the claim, the business writes and the mark commit or roll back
//! together, in the caller's transaction.
//!
//! The transaction is begun on a store (`SqliteStore::begin`, `MySqlStore::begin` and
//! `PgStore::begin` return an [`IdemTx`]: a `SqliteTx`, `MySqlTx`, `PgTx`) and carries
//! that store, so the claim is written to the store's own table, on its own database, by
//! construction: a call cannot claim in one database while lease-mode calls and the sweeper look
//! in another.

use std::future::Future;
use std::ops::DerefMut;
use std::time::Duration;

use async_trait::async_trait;

use super::settle::Settled;
use super::snapshot::{ErrType, OkType};
use super::{Call, encoded, report};
use crate::IdemError;
use crate::metrics::Outcome;
use crate::store::{Acquired, Claim, ClaimOutcome, ClaimRequest, Store};

/// The longest idle bound a transaction-mode claim may put in force: 24 days, inside what both
/// servers take (Postgres's `idle_in_transaction_session_timeout` is at most `i32::MAX` ms, about
/// 24.8 days; MariaDB's `idle_write_transaction_timeout` at most 365 days).
pub const MAX_TX_IDLE_TIMEOUT: Duration = Duration::from_secs(24 * 24 * 3600);

/// How long a session may sit idle inside a transaction that holds a transaction-mode claim
/// before the database server ends it, rolling the transaction back and so freeing the key: the
/// bound on a client that vanished mid-transaction (a paused process, a network gone silent with
/// its TCP connection still open), which otherwise keeps the key's row lock until the server drops
/// its session, by default never.
///
/// Set per call with [`Call::tx_idle_timeout`] / [`Call::no_tx_idle_timeout`], and per store
/// (`PgStoreBuilder::tx_idle_timeout`, `PgStore::with_tx_idle_timeout`, and the same on
/// `MySqlStore`); a call's own setting wins over its store's. A duration is 1 ms ..=
/// [`MAX_TX_IDLE_TIMEOUT`], checked where it is given (the call, `build()`, the setter). "Idle"
/// is the time between two statements of the transaction (the body's own work between them, the
/// caller's time before its commit), never a statement's own run time; keep it longer than the
/// longest gap between statements a healthy caller leaves inside the transaction.
///
/// - Postgres: `idle_in_transaction_session_timeout`, set for the transaction only
///   (`set_config(…, true)`, folded into the claim's statement: no statement or round trip of
///   its own), from the claim to the commit. In whole milliseconds.
/// - MariaDB / MySQL: the session variable `idle_write_transaction_timeout` (whole seconds,
///   rounded up), set in the round trip of the transaction's `BEGIN`, and again in the claim's
///   round trip when the call's bound differs. It applies once the transaction has written (a
///   claim); a claim undone to its savepoint leaves nothing bounded.
/// - SQLite: embedded, so a vanished client is a vanished process, whose transaction goes with
///   it: nothing to bound, and the setting is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TxIdleTimeout {
    /// The call's lease (the default): the lease already says how long a holder may be silent.
    /// A lease longer than [`MAX_TX_IDLE_TIMEOUT`] is bounded at that.
    #[default]
    Lease,
    /// This long (1 ms ..= [`MAX_TX_IDLE_TIMEOUT`]).
    After(Duration),
    /// No bound from idem: the server's own setting applies (none by default), and a vanished
    /// client holds the key until the server drops its session.
    Off,
}

impl TxIdleTimeout {
    /// Checks the range of an explicit duration.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] for a duration under 1 ms or over [`MAX_TX_IDLE_TIMEOUT`].
    pub(crate) fn check(self) -> Result<Self, IdemError> {
        if let TxIdleTimeout::After(d) = self
            && (d < Duration::from_millis(1) || d > MAX_TX_IDLE_TIMEOUT)
        {
            return Err(IdemError::InvalidOptions {
                reason: format!(
                    "the transaction idle timeout {d:?} is out of range: it must be at least 1 ms \
                     (the servers' unit) and at most {} days (idem::MAX_TX_IDLE_TIMEOUT; \
                     Postgres takes at most about 24.8 days); turn it off with \
                     `no_tx_idle_timeout()` / `TxIdleTimeout::Off`",
                    MAX_TX_IDLE_TIMEOUT.as_secs() / 86_400
                ),
            });
        }
        Ok(self)
    }

    /// The bound in force for a claim with `lease` under this setting: `None` when off.
    #[cfg(any(feature = "mysql", feature = "postgres"))]
    pub(crate) fn bound(self, lease: Duration) -> Option<Duration> {
        match self {
            TxIdleTimeout::Lease => {
                Some(lease.clamp(Duration::from_millis(1), MAX_TX_IDLE_TIMEOUT))
            }
            TxIdleTimeout::After(d) => Some(d),
            TxIdleTimeout::Off => None,
        }
    }
}

/// A transaction begun on a store, which a `tx = "…"` call joins.
///
/// Implemented by each SQL backend's transaction type (`idem::SqliteTx` from `SqliteStore::begin`,
/// `idem::MySqlTx` from `MySqlStore::begin`, `idem::PgTx` from `PgStore::begin`); a wrapping store
/// implements it by wrapping its inner store's transaction (`ShardedTx` from
/// `ShardedStore::begin_for`, `EncryptedTx` from `EncryptedStore::begin`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a transaction idem can join",
    label = "`tx` must name a `&mut` transaction begun with the store's `begin()`",
    note = "begin it with `store.begin().await?` on the store that keeps the records: an \
            `idem::SqliteTx`, `idem::MySqlTx` or `idem::PgTx` (`ShardedStore::begin_for` and \
            `EncryptedStore::begin` give theirs), which carries its store and derefs to the connection \
            for your own queries"
)]
#[async_trait]
pub trait IdemTx: Send {
    /// The store this transaction was begun on: its limits, and where lease-mode calls and the
    /// sweeper look.
    fn store(&self) -> &dyn Store;

    /// Opens a savepoint and claims the record in it, waiting (bounded by the database's lock
    /// timeout) for a concurrent transaction that holds the same record. On any outcome but
    /// `Acquired` nothing stays written and the savepoint is released.
    ///
    /// # Errors
    /// Backend errors as for [`Store::claim`].
    async fn claim(&mut self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, IdemError>;

    /// What the next [`IdemTx::claim`]'s call asked of the idle bound it puts in force
    /// ([`TxIdleTimeout`]): `None` when the call said nothing, and then the store's setting
    /// applies (by default the call's lease). Called by the engine just before the claim. A
    /// transaction whose database has no such bound (SQLite) ignores it, which the default does.
    fn idle_timeout(&mut self, call: Option<TxIdleTimeout>) {
        let _ = call;
    }

    /// Marks the claimed record SUCCEEDED with `snapshot`, moves its expiry to at least now +
    /// `ttl` by the store's clock (as [`Store::complete`]), and releases the savepoint.
    ///
    /// `ttl` is the call's ttl: the record's expiry is moved to at least now + ttl, so a body
    /// slower than its ttl still leaves a live success.
    ///
    /// A transaction where nothing outside it can reach the claimed record before its commit may
    /// keep the mark and send it with what it sends next of idem's, or with its commit
    /// (`SqliteTx` does, `BEGIN IMMEDIATE` holding SQLite's write lock); what commits is the same.
    ///
    /// # Errors
    /// [`IdemError::LeaseLost`] if the record is no longer this claim's; backend errors.
    async fn complete(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
    ) -> Result<(), IdemError>;

    /// As [`IdemTx::complete`], the result kept only `result_ttl` from now (as
    /// [`Store::complete_keeping`]).
    ///
    /// # Errors
    /// As [`IdemTx::complete`]; [`IdemError::NotSupported`] for a transaction whose store keeps
    /// every result as long as its record (the default). Every store of this crate supports it.
    async fn complete_keeping(
        &mut self,
        biz: &str,
        key: &str,
        claim: &Claim,
        snapshot: &[u8],
        ttl: Duration,
        result_ttl: Duration,
    ) -> Result<(), IdemError> {
        let _ = (biz, key, claim, snapshot, ttl, result_ttl);
        Err(IdemError::NotSupported {
            backend: self.store().backend(),
            what: "keeping a result for less than its record (result_ttl)",
        })
    }

    /// Rolls back to the savepoint (the claim and every write since) and releases it.
    ///
    /// # Errors
    /// Backend errors.
    async fn abort(&mut self) -> Result<(), IdemError>;
}

/// A store whose database has transactions a `tx = "…"` call can join: its `begin()` hands out an
/// [`IdemTx`] that carries the store. Implemented by every SQL store; [`crate::ShardedStore`] uses
/// it to begin a transaction on the shard a key belongs to.
pub trait TransactionalStore: Store {
    /// The store's transaction (`SqliteTx`, `MySqlTx`, `PgTx`, …).
    type Tx: IdemTx + Send;

    /// Begins a transaction on the store's database.
    ///
    /// # Errors
    /// The store's error.
    fn begin_tx(&self) -> impl Future<Output = Result<Self::Tx, IdemError>> + Send;
}

/// The claim a transactional call holds while its body runs.
struct TxGuard {
    call: Call,
    claim: Claim,
    how: Acquired,
}

/// What a transactional claim found.
#[allow(
    clippy::large_enum_variant,
    reason = "made once per call and taken apart at once; boxing the guard would cost every call an allocation"
)]
enum TxClaim<T> {
    /// Run the body (with `tx_body`); finish with `tx_finish`.
    Run(TxGuard),
    /// Already done in a committed transaction: this is its result.
    Replay(T),
}

/// The span a transactional call runs in: claim, body and mark, as a lease-mode call's.
struct CallSpan(Option<tracing::Span>);

/// The span of `call`.
fn call_span(call: &Call) -> CallSpan {
    CallSpan(super::call_span(call.biz()))
}

/// Runs `fut` inside `span` (bare when the span is disabled).
fn in_span<F: Future>(span: CallSpan, fut: F) -> impl Future<Output = F::Output> {
    super::in_span(span.0, fut)
}

/// Claims inside the caller's transaction (a savepoint).
///
/// # Errors
/// Refusals (`InProgress`, `PayloadMismatch`), bad input and store errors, as for a lease-mode
/// call. Each is counted and reported.
async fn tx_claim<T, C>(call: Call, ok: OkType<T>, tx: &mut C) -> Result<TxClaim<T>, IdemError>
where
    C: IdemTx + ?Sized,
{
    let outcome = match call.request(tx.store()) {
        Ok(req) => {
            let started = crate::metrics::ENABLED.then(std::time::Instant::now);
            tx.idle_timeout(call.tx_idle());
            let outcome = super::bounded(call.store_timeout_in_force(), tx.claim(&req))
                .await
                .map_err(|e| e.during("claim"));
            if let Some(started) = started {
                crate::metrics::claim_latency(req.biz, tx.store().backend(), || started.elapsed());
            }
            outcome
        }
        Err(e) => Err(e),
    };
    // The same answers as a lease-mode claim's: one mapping (settle.rs).
    match super::settle::settle(call.biz(), outcome, None, ok, ErrType::<IdemError>::new()) {
        Settled::Held(claim, how) => Ok(TxClaim::Run(TxGuard { call, claim, how })),
        Settled::Answer(result) => result.map(TxClaim::Replay),
    }
}

/// Runs the body as the holder of the guard's claim (see [`crate::steps::current_claim`]).
async fn tx_body<F: Future>(guard: &TxGuard, body: F) -> F::Output {
    let call = super::current::CallScope::new(guard.call.biz.clone(), guard.call.key.clone(), None);
    super::current::scope(guard.claim, std::sync::Arc::new(call), body).await
}

/// Marks the claim done with the body's result (same transaction), or rolls the claim and the
/// body's writes back to the savepoint when the body failed.
///
/// # Errors
/// The body's error, or an [`IdemError`] converted into `E`.
async fn tx_finish<T, E, C>(
    guard: TxGuard,
    tx: &mut C,
    ok: OkType<T>,
    err: ErrType<E>,
    out: Result<T, E>,
) -> Result<T, E>
where
    C: IdemTx + ?Sized,
{
    let TxGuard { call, claim, how } = guard;
    let (result, outcome) = match out {
        Ok(value) => {
            let limit = tx.store().limits().max_snapshot_len;
            let (snapshot, result, done) =
                encoded(ok, err, value, limit, super::acquired_outcome(how));
            let (biz, key) = (call.biz(), call.key());
            let mark = match call.result_kept() {
                None => tx.complete(biz, key, &claim, &snapshot, call.ttl),
                Some(kept) => tx.complete_keeping(biz, key, &claim, &snapshot, call.ttl, kept),
            };
            match super::bounded(call.store_timeout_in_force(), mark)
                .await
                .map_err(|e| e.during("mark"))
            {
                Ok(()) => (result, done),
                Err(e @ IdemError::LeaseLost { .. }) => (Err(err.from_idem(e)), Outcome::LeaseLost),
                Err(e) => (Err(err.from_idem(e)), Outcome::MarkFailed),
            }
        }
        Err(body_err) => {
            if let Err(e) = super::bounded(call.store_timeout_in_force(), tx.abort()).await {
                tracing::warn!(error = %e, "could not roll the idempotent claim back to its savepoint");
            }
            (Err(body_err), Outcome::Failed)
        }
    };
    report(call.biz(), outcome, claim.attempt);
    result
}

/// Transaction mode's one entry, as `engine::execute` is lease mode's: what `#[idempotent(tx =
/// "…")]` expands to, what [`Call::run_in_tx`] runs and what the HTTP layer's transaction mode
/// runs. In the call's span: claims in a savepoint of `tx`; a stored result is returned without
/// running anything; otherwise `body` gets the transaction (`tx` itself: a `&mut` for the macro, the
/// layer's owned handle), runs as the claim's holder ([`crate::steps::current_claim`]) and gives the
/// transaction back with its result, which is marked in it (a success) or rolled back to the
/// savepoint with the body's writes (an `Err`). The body is a closure returning a future rather
/// than an async closure: its future is then a plain type, which the compiler proves `Send` for a
/// spawned caller (an async closure taking a value with a lifetime is not, today).
///
/// The transaction comes back beside the result, to be committed by whoever began it; `None`
/// when the body did not give it back (the HTTP layer's handler kept it): then nothing was marked,
/// and the body's result (which should be an `Err`) is returned as it is, to be rolled back with
/// the connection.
///
/// # Errors
/// The body's error, or an [`IdemError`] converted into `E`: refused repeats (`InProgress`,
/// `PayloadMismatch`, `ResultExpired`), bad input, store failures of the claim or the mark.
pub async fn run_tx<T, E, C, H, F, Fut>(
    call: Call,
    ok: OkType<T>,
    err: ErrType<E>,
    mut tx: H,
    body: F,
) -> (Option<H>, Result<T, E>)
where
    C: IdemTx + ?Sized,
    H: DerefMut<Target = C>,
    F: FnOnce(H) -> Fut,
    Fut: Future<Output = (Option<H>, Result<T, E>)>,
{
    in_span(call_span(&call), async move {
        let guard = match tx_claim(call, ok, &mut *tx).await {
            Ok(TxClaim::Run(guard)) => guard,
            Ok(TxClaim::Replay(value)) => return (Some(tx), Ok(value)),
            Err(e) => return (Some(tx), Err(err.from_idem(e))),
        };
        match tx_body(&guard, body(tx)).await {
            (Some(mut tx), out) => {
                let result = tx_finish(guard, &mut *tx, ok, err, out).await;
                (Some(tx), result)
            }
            (None, out) => {
                report(guard.call.biz(), Outcome::Failed, guard.claim.attempt);
                (None, out)
            }
        }
    })
    .await
}

impl Call {
    /// Runs `body` at most once for this call's `(biz, key)`, inside the caller's transaction `tx`
    /// (what `#[idempotent(tx = "tx")]` expands to): the claim is made in a savepoint of `tx`, the
    /// body gets `tx` for its own writes, and the mark is written in `tx` too, so claim, business
    /// writes and mark commit or roll back together with the caller's commit or rollback. A body
    /// `Err` rolls the claim and the body's writes back to the savepoint.
    ///
    /// ```
    /// # use idem_runtime as idem;
    /// # async fn demo() -> Result<(), idem_runtime::IdemError> {
    /// use idem::{Call, IdemError, SqliteStore};
    /// let store = SqliteStore::in_memory().await?;
    /// store.migrate().await?;
    /// let mut tx = store.begin().await?;
    /// let n: Result<i64, IdemError> = Call::new("PAY", "order-1")
    ///     .run_in_tx(&mut tx, async |tx| {
    ///         let one: i64 = idem::sqlx::query_scalar("SELECT 1")
    ///             .fetch_one(&mut **tx)
    ///             .await
    ///             .map_err(IdemError::store)?;
    ///         Ok(one)
    ///     })
    ///     .await;
    /// tx.commit().await?;
    /// assert_eq!(n?, 1);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The body's error, or an [`IdemError`] converted into `E`: refused repeats (`InProgress`,
    /// `PayloadMismatch`), bad input, store failures.
    pub async fn run_in_tx<C, T, E, F>(self, tx: &mut C, body: F) -> Result<T, E>
    where
        C: IdemTx + ?Sized,
        T: serde::Serialize + serde::de::DeserializeOwned,
        E: From<IdemError>,
        F: AsyncFnOnce(&mut C) -> Result<T, E>,
    {
        let (ok, err) = (OkType::new(), ErrType::new());
        let run = run_tx(self, ok, err, tx, |tx| async move {
            let out = body(&mut *tx).await;
            (Some(tx), out)
        });
        run.await.1
    }
}
