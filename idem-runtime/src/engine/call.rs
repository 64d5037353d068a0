//! `Call`: one idempotent call's identity and options, built by hand or by `#[idempotent]`.

use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::snapshot::{ErrType, OkType};
use super::{NoRecover, StoreHandle, execute};
use crate::store::ClaimRequest;
use crate::{IdemError, IdemKey, Store, fingerprint, key};

mod checks;
mod store_timeout;
pub(crate) use checks::{check_durations, check_result_ttl, check_store_timeout};
use store_timeout::ambient_store_timeout;
pub use store_timeout::with_store_timeout;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) use store_timeout::{TxStep, tx_step};

/// Default record lifetime: 7 days.
pub const DEFAULT_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default lease: 30 seconds.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// A third of [`DEFAULT_LEASE`]: the default heartbeat's period for it.
const DEFAULT_LEASE_THIRD: Duration = Duration::from_secs(10);
/// Default bound on each of a call's store steps (its claim, a replay's read, a renewal, its
/// mark): 10 seconds. See [`Call::store_timeout`].
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(10);

/// One idempotent call, built by hand or by `#[idempotent]`.
///
/// ```
/// # use idem_runtime as idem;
/// # async fn demo() -> Result<(), idem_runtime::IdemError> {
/// use idem::{Call, MemoryStore};
/// let store = MemoryStore::new();
/// let receipt: Result<String, idem::IdemError> = Call::new("PAY", "order-1")
///     .run(&store, async { Ok("paid".to_owned()) })
///     .await;
/// assert_eq!(receipt?, "paid");
/// # Ok(()) }
/// ```
///
/// The builder takes what the attribute's options say: `Call::new("PAY",
/// &key).fingerprint(&req).wait(d).heartbeat(d).run(&store, async { … })`. [`ttl`](Call::ttl) must
/// be longer than the lease and at most [`MAX_DURATION`](crate::MAX_DURATION),
/// [`lease`](Call::lease) is 1 ms ..= the maximum, [`wait`](Call::wait) 0 ..= the maximum,
/// [`heartbeat`](Call::heartbeat) 1 ms up to the lease (exclusive; a third of the lease by default,
/// [`no_heartbeat`](Call::no_heartbeat) turns it off). They are checked when the call runs, and
/// nothing is written when one is out of range ([`IdemError::InvalidOptions`]). In a transaction:
/// [`run_in_tx`](Call::run_in_tx)`(&mut tx, async |tx| { … })`, where the transaction may sit idle
/// at most [`tx_idle_timeout`](Call::tx_idle_timeout) (the lease by default; 1 ms ..=
/// [`MAX_TX_IDLE_TIMEOUT`](crate::MAX_TX_IDLE_TIMEOUT)) before the server ends it and frees the
/// key; with a recover fn: [`recover`](Call::recover).
///
/// # What a call does
///
/// The claim reads the `(biz, key)` record and decides in one atomic step of the store:
///
/// | record found | effect | caller gets |
/// | --- | --- | --- |
/// | none, or expired | insert PROCESSING, attempt 1, a new fence | the body runs |
/// | SUCCEEDED, same fingerprint | nothing | the stored result, replayed |
/// | SUCCEEDED, same fingerprint, its result ttl passed (a tombstone) | nothing | [`IdemError::ResultExpired`] (410); the body does not run |
/// | SUCCEEDED or PROCESSING, other fingerprint | nothing | [`IdemError::PayloadMismatch`] (422) |
/// | PROCESSING, lease valid | nothing (or wait, with [`wait`](Call::wait)) | [`IdemError::InProgress`] with `retry_after` (409) |
/// | PROCESSING with expired lease, or FAILED | take over: attempt + 1, a new fence, a new lease | the body runs (a [`recover`](Call::recover) fn is asked first on a takeover of PROCESSING) |
///
/// - **Lease over TTL.** Expired means the TTL has passed *and* no lease is live: a live lease is
///   never cut short by the TTL or by the sweeper, and a takeover extends the record's life to
///   cover its lease. A mark moves the record's expiry to at least the mark's time plus the ttl
///   (store clock), so a success is never recorded already expired, however long its body ran.
/// - **Fences.** Every claim gets a fencing token that never repeats for a key and only grows, also
///   after the record was swept and created again (the store's clock in microseconds, or one more
///   than the last fence). Marking is a compare-and-set on it: a finisher whose claim was taken
///   over or swept gets [`IdemError::LeaseLost`] and changes nothing. The body reads its claim with
///   [`current_claim()`](crate::steps::current_claim) and can pass `claim.fence` to its own downstream
///   writes, so a storage service can refuse a write that carries an older fence (the
///   fencing-token pattern).
/// - The body's `Err` marks the record FAILED: the next call runs again.
/// - A panic or a cancelled future leaves the claim PROCESSING (never SUCCEEDED); its lease
///   expires.
/// - A result that cannot be stored (fails to serialize, or over
///   [`Limits::max_snapshot_len`](crate::store::Limits::max_snapshot_len), 64 KiB by default) ran, so the
///   claim is kept as done: the caller and every repeat get [`IdemError::ResultNotStorable`] and
///   the business never runs twice (outcome `unstorable`).
/// - Times come from the store's clock, never the application's: a server's (`NOW()`, Redis
///   `TIME`); for SQLite, the system clock of the process that opened the file.
/// - **Store errors are classified.** A locked or contended database ([`IdemError::StoreBusy`]:
///   locked, lock-wait timeout, deadlock, serialization failure) and a lost connection
///   ([`IdemError::StoreUnavailable`]) are retryable (503, or 409 for a deadlock or serialization
///   conflict); idem retries a claim, a mark and a renewal itself a few times with jittered
///   back-off. A finished body's mark (and a failure mark) keeps trying for as long as its lease is
///   live, less a tenth of it (at most 1 s), and its store timeout allows, while the heartbeat
///   keeps renewing on its schedule for up to three leases: a store restart inside that time is
///   waited out, and the record ends SUCCEEDED. A missing table ([`IdemError::StoreSchema`]) says
///   to run `migrate()`. A mark that still never lands is reported (outcome `mark_failed`) and the
///   claim protects the key until its lease ends.
/// - **Every call answers within its store timeout** ([`store_timeout`](Call::store_timeout),
///   10 s by default) per store step, whatever the network does: a store that stops answering (a
///   network gone silent, a hung server or load balancer) ends the step with `StoreUnavailable`
///   (503 with `Retry-After`). A claim that timed out ran nothing; a mark that timed out leaves the
///   record PROCESSING, so the key stays protected until its lease ends and then a repeat takes
///   over (asking `recover` first). A connection cut off mid-statement is closed, never handed to
///   the next statement. Keep the store timeout longer than a restart of your store takes if a
///   finished body should wait that restart out.
/// - Each error says [`is_retryable()`](IdemError::is_retryable) and
///   [`http_status()`](IdemError::http_status).
///
/// Why these rules, and the record's whole lifecycle: `docs/DESIGN.md` in the repository.
#[derive(Debug, Clone)]
pub struct Call {
    pub(crate) biz: Cow<'static, str>,
    pub(crate) key: String,
    pub(crate) ttl: Duration,
    pub(crate) lease: Duration,
    /// The options a call sets only when asked (`None`: every one at its default): on the heap,
    /// so a call without them is a small value, moved cheaply into the call's future.
    pub(crate) more: Option<Box<More>>,
    /// Whether the durations were checked already (by `#[idempotent]`, when it compiled); a
    /// builder method that sets one clears it.
    checked: bool,
    /// Whether the key's text needs no check but its length (an integer's: see
    /// [`IdemKey::text_is_always_valid`]).
    plain_key: bool,
}

/// A [`Call`]'s options that are not always set.
#[derive(Debug, Clone, Default)]
pub(crate) struct More {
    pub(crate) fingerprint: Option<Result<String, String>>,
    pub(crate) wait: Option<Duration>,
    pub(crate) heartbeat: Heartbeat,
    /// Set by [`Call::result_ttl`]: how long the result is kept, when shorter than the ttl.
    pub(crate) result_ttl: Option<Duration>,
    /// Set by [`Call::store_timeout`]; else the surrounding inbox's, or the default.
    store_timeout: Option<Duration>,
    /// Set by [`Call::tx_idle_timeout`] or [`Call::no_tx_idle_timeout`]; else the store's.
    pub(crate) tx_idle: Option<crate::TxIdleTimeout>,
}

impl More {
    /// Every option at its default.
    const NONE: More = More {
        fingerprint: None,
        wait: None,
        heartbeat: Heartbeat::Default,
        result_ttl: None,
        store_timeout: None,
        tx_idle: None,
    };
}

/// When a lease-mode call renews its lease while the body runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Heartbeat {
    /// Every third of the lease (the default): see [`Heartbeat::every`].
    #[default]
    Default,
    /// Every this long: at least 1 ms and shorter than the lease.
    Every(Duration),
    /// Never: a body that outlives its lease may be taken over while it runs.
    Off,
}

impl Heartbeat {
    /// How often a call with `lease` renews it: a third of the lease by default (none for a lease
    /// under 3 ms), the given period, or never.
    pub(crate) fn every(self, lease: Duration) -> Option<Duration> {
        match self {
            // The default lease's third without a division.
            Heartbeat::Default if lease == DEFAULT_LEASE => Some(DEFAULT_LEASE_THIRD),
            Heartbeat::Default => Some(lease / 3).filter(|d| *d >= Duration::from_millis(1)),
            Heartbeat::Every(every) => Some(every),
            Heartbeat::Off => None,
        }
    }

    /// The period given explicitly, which must be in range.
    pub(crate) fn given(self) -> Option<Duration> {
        match self {
            Heartbeat::Every(every) => Some(every),
            Heartbeat::Default | Heartbeat::Off => None,
        }
    }
}

impl Call {
    /// A call for `(biz, key)` with the default TTL (7 days), lease (30 s) and heartbeat (every
    /// 10 s, a third of the lease), no fingerprint, and in-progress repeats rejected.
    pub fn new<K: IdemKey + ?Sized>(biz: impl Into<Cow<'static, str>>, key: &K) -> Self {
        Call {
            biz: biz.into(),
            key: key.to_key(),
            plain_key: key.text_is_always_valid(),
            ttl: DEFAULT_TTL,
            lease: DEFAULT_LEASE,
            more: None,
            checked: false,
        }
    }

    /// How long the record lives.
    #[inline]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self.checked = false;
        self
    }

    /// Keeps the result for replay only `result_ttl` after the call finished (by the store's
    /// clock), while the key stays used for its whole [`ttl`](Call::ttl): from then until the
    /// ttl ends the record is a tombstone (business type, key, fingerprint, attempt, expiry; a
    /// sweep drops the result itself), and a repeat with the same payload is refused with
    /// [`IdemError::ResultExpired`] (HTTP 410) instead of running the body again. A repeat with
    /// another payload is still a [`IdemError::PayloadMismatch`].
    ///
    /// So a payment can stay unique for 30 days while its full response is kept for one: late
    /// repeats (a re-run job, a replayed dead-letter queue) are refused, and the store holds a
    /// day of responses, not a month. Default: the result is kept as long as the key (the ttl).
    /// Range 1 ms ..= the ttl (equal to the ttl is the default).
    ///
    /// ```
    /// # use idem_runtime as idem;
    /// # async fn demo(store: &idem_runtime::MemoryStore) -> Result<(), idem_runtime::IdemError> {
    /// use std::time::Duration;
    /// use idem::Call;
    /// let day = Duration::from_secs(24 * 3600);
    /// let receipt: String = Call::new("PAY", "order-1")
    ///     .ttl(30 * day)
    ///     .result_ttl(day)
    ///     .run(store, async { Ok::<_, idem::IdemError>("paid".to_owned()) })
    ///     .await?;
    /// # let _ = receipt; Ok(()) }
    /// ```
    #[inline]
    pub fn result_ttl(mut self, result_ttl: Duration) -> Self {
        self.more_mut().result_ttl = Some(result_ttl);
        self.checked = false;
        self
    }

    /// How long a claim protects itself before another attempt may take it over.
    #[inline]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self.checked = false;
        self
    }

    /// Wait up to `max` for an in-progress call to finish (then replay it) instead of refusing at once.
    #[inline]
    pub fn wait(mut self, max: Duration) -> Self {
        self.more_mut().wait = Some(max);
        self.checked = false;
        self
    }

    /// Bounds each store step of the call (default [`DEFAULT_STORE_TIMEOUT`], 10 s, or the
    /// inbox's [`store_timeout`](crate::inbox::InboxBuilder::store_timeout) for the calls of its
    /// handlers; range 1 ms
    /// ..= [`MAX_DURATION`](crate::MAX_DURATION)): the claim with its retries (which also reads
    /// a replay), each renewal, the mark with its retries, the release after a failed `recover`,
    /// each statement of transaction mode. A store that does not answer in time (a network gone
    /// silent, a server that hangs) ends the step with [`IdemError::StoreUnavailable`], which is
    /// retryable (HTTP 503): the caller is never held longer than this per step.
    ///
    /// A claim that times out ran nothing. A mark that times out leaves its record PROCESSING:
    /// the body's effect may have happened, so the key stays protected until its lease ends and
    /// then a repeat takes over (asking `recover` first, if given). A mark keeps trying through a
    /// store restart for as long as this allows, so keep it longer than a restart of your store
    /// takes when no `recover` can look the effect up.
    #[inline]
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.more_mut().store_timeout = Some(timeout);
        self.checked = false;
        self
    }

    /// Renews the lease every `every` while the body runs, instead of every third of the lease
    /// (the default), so a slow but healthy body keeps its claim: each renewal extends the lease to
    /// a full `lease` from the store's now (and the record's life with it). `every` is at least
    /// 1 ms and shorter than the lease. A body that hangs keeps renewing, so bound its own waits;
    /// a renewal that finds the claim taken over stops renewing and the call ends with
    /// [`IdemError::LeaseLost`].
    #[inline]
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.more_mut().heartbeat = Heartbeat::Every(every);
        self.checked = false;
        self
    }

    /// Never renews the lease: a body that runs longer than its lease may then be taken over by a
    /// repeat while it still runs, and its effect happen twice. For bodies known to be short, or
    /// to show what the heartbeat prevents.
    #[inline]
    pub fn no_heartbeat(mut self) -> Self {
        self.more_mut().heartbeat = Heartbeat::Off;
        self.checked = false;
        self
    }

    /// In transaction mode, has the database server end the session of a transaction that holds
    /// this call's claim and then sits idle (no statement) longer than `idle`, rolling it back:
    /// a repeat can take the key once a client that vanished mid-transaction (paused, or its
    /// network gone silent) has been idle this long. Default: the call's [`lease`](Call::lease)
    /// (at most [`MAX_TX_IDLE_TIMEOUT`](crate::MAX_TX_IDLE_TIMEOUT)), unless the store sets
    /// another; this call's setting wins over the store's. Range 1 ms ..=
    /// [`MAX_TX_IDLE_TIMEOUT`](crate::MAX_TX_IDLE_TIMEOUT), checked when the call runs
    /// ([`IdemError::InvalidOptions`], nothing written). Postgres bounds it in milliseconds,
    /// MariaDB in whole seconds (rounded up); SQLite ignores it. Lease mode ignores it. How each
    /// server does it: [`TxIdleTimeout`](crate::TxIdleTimeout).
    ///
    /// "Idle" is the time between two statements of the transaction: keep it longer than the
    /// longest pause a healthy caller leaves between the claim and its commit (a slow remote call
    /// in the body between two queries), or the server ends the transaction and the commit fails
    /// with [`IdemError::StoreUnavailable`].
    #[inline]
    pub fn tx_idle_timeout(mut self, idle: Duration) -> Self {
        self.more_mut().tx_idle = Some(crate::TxIdleTimeout::After(idle));
        self.checked = false;
        self
    }

    /// In transaction mode, puts no idle bound in force for this call, whatever the store's
    /// setting ([`Call::tx_idle_timeout`]): the server's own setting applies (none by default),
    /// and a client that vanished mid-transaction holds the key until the server drops its
    /// session.
    #[inline]
    pub fn no_tx_idle_timeout(mut self) -> Self {
        self.more_mut().tx_idle = Some(crate::TxIdleTimeout::Off);
        self
    }

    /// The call's own idle bound for transaction mode, if it set one.
    #[inline]
    pub(crate) fn tx_idle(&self) -> Option<crate::TxIdleTimeout> {
        self.more().tx_idle
    }

    /// The options set beyond the business type, key, ttl and lease.
    #[inline]
    pub(crate) fn more(&self) -> &More {
        self.more.as_deref().unwrap_or(&More::NONE)
    }

    /// The options, to set one.
    pub(crate) fn more_mut(&mut self) -> &mut More {
        self.more.get_or_insert_with(Box::default)
    }

    /// The call's store timeout: its own, or that of the inbox whose handler runs it, or
    /// [`DEFAULT_STORE_TIMEOUT`].
    pub(crate) fn store_timeout_in_force(&self) -> Duration {
        self.more()
            .store_timeout
            .unwrap_or_else(ambient_store_timeout)
    }

    /// How long the result is kept when that is shorter than the ttl (`None`: as long as the
    /// record), for the mark.
    #[inline]
    pub(crate) fn result_kept(&self) -> Option<Duration> {
        self.more().result_ttl.filter(|kept| *kept < self.ttl)
    }

    /// How often this call renews its lease while the body runs, if at all.
    pub(crate) fn heartbeat_every(&self) -> Option<Duration> {
        self.more().heartbeat.every(self.lease)
    }

    /// Asks `recover` before the body runs again for a record that may already have had its
    /// effect (a look-up of the real business result, backfilled into the record). That is a
    /// takeover: a PROCESSING record whose lease ended because its holder died, paused, or could
    /// not mark its result. `recover` answers "did this action already happen, and with what
    /// result?", by looking the payment up in the gateway or the order in its table:
    ///
    /// - `Ok(Some(value))`: the record is marked SUCCEEDED with `value` (under the new claim's
    ///   fence), the caller gets it, the body does not run (outcome `recovered`);
    /// - `Ok(None)`: nothing happened; the body runs as it would have;
    /// - `Err(e)`: the caller gets `e` and nothing runs; the claim is released (the record stays
    ///   PROCESSING, its lease ended), so the next call asks `recover` again (outcome
    ///   `recover_failed`).
    ///
    /// A fresh claim, a retry after a recorded failure, and a replay never call it.
    ///
    /// ```
    /// # use idem_runtime as idem;
    /// # async fn demo(store: &idem_runtime::MemoryStore) -> Result<(), idem_runtime::IdemError> {
    /// use idem::Call;
    /// # async fn find_payment(_: &str) -> Result<Option<String>, idem_runtime::IdemError> { Ok(None) }
    /// # async fn charge(_: &str) -> Result<String, idem_runtime::IdemError> { Ok("pay-1".into()) }
    /// let order = "order-7";
    /// let payment: String = Call::new("PAY", order)
    ///     .recover(|| find_payment(order))
    ///     .run(store, charge(order))
    ///     .await?;
    /// # let _ = payment; Ok(()) }
    /// ```
    pub fn recover<R>(self, recover: R) -> Recovering<R> {
        Recovering {
            call: self,
            recover,
        }
    }

    /// Fingerprints `payload`: a repeat with the same key and another payload gets
    /// [`IdemError::PayloadMismatch`].
    pub fn fingerprint<P: Serialize + ?Sized>(mut self, payload: &P) -> Self {
        self.more_mut().fingerprint = Some(fingerprint::fingerprint(payload));
        self
    }

    /// Sets a fingerprint the caller computed itself (a hash of the request's bytes).
    #[cfg(feature = "layer-core")]
    pub(crate) fn fingerprint_hash(mut self, hash: String) -> Self {
        self.more_mut().fingerprint = Some(Ok(hash));
        self
    }

    /// The same call, its durations marked as checked: what `#[idempotent]` does with the call
    /// it built from literals it checked when it compiled.
    #[inline]
    pub(crate) fn checked(mut self) -> Self {
        self.checked = true;
        self
    }

    /// The business type.
    #[inline]
    pub fn biz(&self) -> &str {
        &self.biz
    }

    /// The key as stored.
    #[inline]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Runs `body` at most once for this call's `(biz, key)` on `store`.
    ///
    /// # Errors
    /// The body's own error, or an [`IdemError`] converted into `E`: refused repeats
    /// (`InProgress`, `PayloadMismatch`), bad input (`InvalidKey`, …), store failures, `LeaseLost`.
    #[inline(always)]
    pub fn run<'a, T, E, F>(
        self,
        store: &'a dyn Store,
        body: F,
    ) -> impl Future<Output = Result<T, E>> + 'a
    where
        T: Serialize + DeserializeOwned + 'a,
        E: From<IdemError> + 'a,
        F: Future<Output = Result<T, E>> + 'a,
    {
        execute(
            Ok(StoreHandle::Borrowed(store)),
            self,
            OkType::new(),
            ErrType::new(),
            None::<NoRecover<T, E>>,
            None,
            None,
            body,
        )
    }

    pub(crate) fn request(&self, store: &dyn Store) -> Result<ClaimRequest<'_>, IdemError> {
        let limits = store.limits();
        key::validate_biz(&self.biz, limits.max_biz_len)?;
        if !self.plain_key || self.key.len() > limits.max_key_len {
            key::validate_key(&self.key, limits.max_key_len)?;
        }
        if !self.checked {
            let more = self.more();
            check_durations(self.ttl, self.lease, more.wait, more.heartbeat.given())?;
            if let Some(kept) = more.result_ttl {
                check_result_ttl(kept, self.ttl)?;
            }
            if let Some(timeout) = more.store_timeout {
                // One from an inbox was checked when it was built.
                check_store_timeout(timeout)?;
            }
            if let Some(idle) = more.tx_idle {
                idle.check()?;
            }
        }
        let fingerprint = match &self.more().fingerprint {
            None => None,
            Some(Ok(fp)) => Some(fp.as_str()),
            Some(Err(reason)) => {
                return Err(IdemError::Fingerprint {
                    reason: reason.clone(),
                });
            }
        };
        Ok(ClaimRequest {
            biz: &self.biz,
            key: &self.key,
            fingerprint,
            lease: self.lease,
            ttl: self.ttl,
        })
    }
}

/// A [`Call`] with a recover fn: see [`Call::recover`].
#[derive(Debug, Clone)]
#[must_use = "a call does nothing until it is run"]
pub struct Recovering<R> {
    call: Call,
    recover: R,
}

impl<R> Recovering<R> {
    /// Runs `body` at most once for the call's `(biz, key)` on `store`, asking the recover fn
    /// first when the call takes over a claim whose holder did not finish.
    ///
    /// # Errors
    /// As [`Call::run`], plus the recover fn's own error.
    #[inline(always)]
    pub fn run<'a, T, E, F, RF>(
        self,
        store: &'a dyn Store,
        body: F,
    ) -> impl Future<Output = Result<T, E>> + 'a
    where
        T: Serialize + DeserializeOwned + 'a,
        E: From<IdemError> + 'a,
        F: Future<Output = Result<T, E>> + 'a,
        R: FnOnce() -> RF + 'a,
        RF: Future<Output = Result<Option<T>, E>> + 'a,
    {
        execute(
            Ok(StoreHandle::Borrowed(store)),
            self.call,
            OkType::new(),
            ErrType::new(),
            Some(self.recover),
            None,
            None,
            body,
        )
    }
}

#[cfg(test)]
mod tests;
