//! What an operator does to a store by hand, as functions (the `idem` CLI is a thin shell over
//! them): [`inspect`] a record (an HTTP layer's by the caller and key it was sent with:
//! [`inspect_http`]), list the [`stuck_all`] records of every business type,
//! [`release`] a stuck claim so the next call takes it over (and asks its recover fn), mark one
//! FAILED when its effect is known not to have happened ([`mark_failed`]), [`sweep`] expired
//! records, and count records per status with [`Store::stats`].
//!
//! Every write here goes through the store's fenced operations, never around them: a release is
//! [`Store::release`] and a mark of failure [`Store::fail`], each under the record's own fence,
//! so neither changes anything once another attempt took the record over, and neither ever
//! touches a success.
//!
//! **Release, not mark failed, for a worker that died mid-call.** A holder that died may have had
//! its effect (the payment went through, the process died before the mark). A release keeps the
//! record PROCESSING with its lease ended: the next call takes it over and asks its `recover` fn
//! first (and the [`crate::Reconciler`] resolves it), so a payment that happened is found, not
//! made again. A record marked FAILED is run again by the next call without asking anything: use
//! [`mark_failed`] only when you know the effect did not happen.
//!
//! ```
//! # async fn demo() -> Result<(), idem_runtime::IdemError> {
//! # use idem_runtime as idem;
//! use idem::admin::{self, Release, Released};
//!
//! let store = idem::connect("memory:").await?;
//! match admin::release(&store, "PAY", "order-7", Release { reason: "INC-42: worker died", force: false }).await? {
//!     Released::LeaseEnded { .. } => println!("released: the next call takes it over and asks recover"),
//!     other => println!("nothing changed: {other:?}"),
//! }
//! # Ok(()) }
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::IdemError;
use crate::store::{Claim, Record, Status, Store};
use crate::tokens::TokenStore;

/// The longest release reason, in bytes.
pub const MAX_REASON_LEN: usize = 200;

/// How [`release`] is asked to release a claim.
#[derive(Debug, Clone, Copy)]
pub struct Release<'a> {
    /// Why (an incident number, a ticket): 1 to [`MAX_REASON_LEN`] bytes, no control characters.
    /// Logged with the business type and the fence (never the key).
    pub reason: &'a str,
    /// Release even while the holder's lease is still running. The holder may still be running
    /// its body: if it is, its mark is then refused ([`IdemError::LeaseLost`]) and the next call
    /// runs the body again, so the business may run twice.
    pub force: bool,
}

/// What [`release`] or [`mark_failed`] did. Only [`Released::LeaseEnded`] and
/// [`Released::Failed`] changed the record; every other answer left it as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Released {
    /// [`release`]: the record was PROCESSING and still is, under the same fence, with its lease
    /// ended now: the next call with this key takes it over (attempt + 1, a new fence) and asks
    /// its recover fn first, and the [`crate::Reconciler`] lists and resolves it. The old holder,
    /// if it is still running, may mark it until someone takes it over; after that its mark is
    /// refused.
    LeaseEnded {
        /// The record as it was just before (PROCESSING).
        before: Record,
    },
    /// [`mark_failed`]: the record was PROCESSING and is now FAILED under the same fence: the
    /// next call with this key runs the body again (attempt + 1) without asking any recover fn,
    /// and the old holder's mark, if it ever comes, is refused.
    Failed {
        /// The record as it was just before (PROCESSING).
        before: Record,
    },
    /// The record was FAILED already: the next call runs again anyway. Not an error, and nothing
    /// was written.
    AlreadyFailed {
        /// The record as read.
        record: Record,
    },
    /// No record for `(biz, key)` (never claimed, or expired and swept).
    NotFound,
    /// Refused: the record SUCCEEDED, and its result is what repeats replay. Never changed.
    Succeeded {
        /// The record as read.
        record: Record,
    },
    /// Refused without [`Release::force`]: the holder's lease is still running (by this
    /// machine's clock), so it may still be running its body.
    LeaseLive {
        /// The record as read.
        record: Record,
        /// How long the lease still runs.
        remaining: Duration,
    },
    /// Another attempt took the record over between the read and the release (or marked it):
    /// nothing changed.
    LeaseLost {
        /// The record as read again after the refusal: who holds it now (`None`: it is gone).
        now: Option<Record>,
    },
}

impl Released {
    /// Whether the record was changed (its lease ended, or it is FAILED, because of this call).
    pub fn changed(&self) -> bool {
        matches!(self, Released::LeaseEnded { .. } | Released::Failed { .. })
    }

    /// Whether the key is free for the next call afterwards (its lease ended, or FAILED), by this
    /// call or an earlier one.
    pub fn released(&self) -> bool {
        matches!(
            self,
            Released::LeaseEnded { .. } | Released::Failed { .. } | Released::AlreadyFailed { .. }
        )
    }
}

/// Checks a release reason: 1 to [`MAX_REASON_LEN`] bytes, no control characters.
///
/// # Errors
/// [`IdemError::InvalidOptions`] saying what is wrong.
pub fn check_reason(reason: &str) -> Result<(), IdemError> {
    let why = if reason.trim().is_empty() {
        "it is empty"
    } else if reason.len() > MAX_REASON_LEN {
        "it is longer than 200 bytes"
    } else if reason.chars().any(char::is_control) {
        "it has a control character (a newline, a tab, …)"
    } else {
        return Ok(());
    };
    Err(IdemError::InvalidOptions {
        reason: format!(
            "a release needs a reason of 1 to {MAX_REASON_LEN} bytes without control characters: {why}"
        ),
    })
}

/// The record of `(biz, key)`, expired or not: [`Store::load`].
///
/// # Errors
/// The store's error.
pub async fn inspect(store: &dyn Store, biz: &str, key: &str) -> Result<Option<Record>, IdemError> {
    store.load(biz, key).await
}

/// The HTTP layer's record of the `Idempotency-Key` value `idempotency_key` that `principal` sent
/// (`None` for a layer without one), under the layer's business type `biz` (`HTTP` unless the
/// layer set another): [`inspect`] of [`crate::key::http_record_key`]. The layer stores a hash of the
/// caller and the key, never the key, so this is how "what happened to request X of customer Y"
/// is answered.
///
/// # Errors
/// [`IdemError::InvalidKey`] for a value the layer would refuse; the store's errors.
pub async fn inspect_http(
    store: &dyn Store,
    biz: &str,
    principal: Option<&str>,
    idempotency_key: &str,
) -> Result<Option<Record>, IdemError> {
    let key = crate::http_record_key(principal, idempotency_key)?;
    store.load(biz, &key).await
}

/// Releases a stuck claim: ends the lease of the PROCESSING record of `(biz, key)` now, under
/// the record's own fence, keeping it PROCESSING, so the next call with that key takes it over
/// and asks its recover fn before it runs the body (and the [`crate::Reconciler`] can resolve
/// it). A body that had its effect before its holder died is then found, not run again. Whether
/// the lease is still running is judged by this machine's clock (see [`release_at`]).
///
/// The reason is checked before anything is read, and logged (`tracing::warn!`) with the business
/// type and the fence, never the key. A record that SUCCEEDED is never touched; one already FAILED
/// is reported as [`Released::AlreadyFailed`]; a lease still running is refused unless
/// [`Release::force`]; and when another attempt takes the record over between the read and the
/// release, the store refuses the fenced write and the answer is [`Released::LeaseLost`] with the
/// record as it is now.
///
/// # Errors
/// [`IdemError::InvalidOptions`] for a bad reason; the store's errors.
pub async fn release(
    store: &dyn Store,
    biz: &str,
    key: &str,
    opts: Release<'_>,
) -> Result<Released, IdemError> {
    release_at(store, biz, key, opts, wall_ms()).await
}

/// [`release`], judging the lease against `now_ms` (milliseconds since the Unix epoch on the
/// store's clock) instead of this machine's clock: for tests on a [`crate::TestClock`], or a
/// caller that read the store's clock.
///
/// # Errors
/// As [`release`].
pub async fn release_at(
    store: &dyn Store,
    biz: &str,
    key: &str,
    opts: Release<'_>,
    now_ms: i64,
) -> Result<Released, IdemError> {
    act(store, biz, key, opts, now_ms, Act::EndLease).await
}

/// Marks the PROCESSING record of `(biz, key)` FAILED, under its own fence: the next call with
/// that key runs the body again **without asking any recover fn**. For a claim whose effect you
/// know did not happen (the payment gateway says it never saw the order); a worker that died
/// mid-call may have had its effect, and is what [`release`] is for. Otherwise as [`release`]:
/// the same checks and answers, [`Released::Failed`] when it changed the record; logged at
/// `warn` with the reason.
///
/// # Errors
/// As [`release`].
pub async fn mark_failed(
    store: &dyn Store,
    biz: &str,
    key: &str,
    opts: Release<'_>,
) -> Result<Released, IdemError> {
    mark_failed_at(store, biz, key, opts, wall_ms()).await
}

/// [`mark_failed`], judging the lease against `now_ms` (as [`release_at`]).
///
/// # Errors
/// As [`release`].
pub async fn mark_failed_at(
    store: &dyn Store,
    biz: &str,
    key: &str,
    opts: Release<'_>,
    now_ms: i64,
) -> Result<Released, IdemError> {
    act(store, biz, key, opts, now_ms, Act::MarkFailed).await
}

/// What an operator's write does to a stuck claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    /// [`release`]: end the lease, keep the record PROCESSING.
    EndLease,
    /// [`mark_failed`]: FAILED.
    MarkFailed,
}

/// [`release_at`] and [`mark_failed_at`]: the checks they share, then `act` under the record's
/// fence.
async fn act(
    store: &dyn Store,
    biz: &str,
    key: &str,
    opts: Release<'_>,
    now_ms: i64,
    act: Act,
) -> Result<Released, IdemError> {
    check_reason(opts.reason)?;
    let Some(record) = store.load(biz, key).await? else {
        return Ok(Released::NotFound);
    };
    match record.status {
        Status::Succeeded => return Ok(Released::Succeeded { record }),
        Status::Failed => return Ok(Released::AlreadyFailed { record }),
        Status::Processing => {}
    }
    let remaining = record.lease_until_ms.saturating_sub(now_ms);
    if remaining > 0 && !opts.force {
        return Ok(Released::LeaseLive {
            remaining: Duration::from_millis(remaining.unsigned_abs()),
            record,
        });
    }
    let claim = Claim {
        attempt: record.attempt,
        fence: record.fence,
    };
    let written = match act {
        Act::EndLease => store.release(biz, key, &claim).await,
        Act::MarkFailed => store.fail(biz, key, &claim).await,
    };
    let forced = opts.force && remaining > 0;
    match written {
        Ok(()) if act == Act::EndLease => {
            tracing::warn!(
                biz,
                reason = opts.reason,
                fence = record.fence.get(),
                attempt = record.attempt,
                forced,
                "idem: a claim was released by hand; the next call takes it over and asks its recover fn"
            );
            Ok(Released::LeaseEnded { before: record })
        }
        Ok(()) => {
            tracing::warn!(
                biz,
                reason = opts.reason,
                fence = record.fence.get(),
                attempt = record.attempt,
                forced,
                "idem: a claim was marked FAILED by hand; the next call runs the body again without asking recover"
            );
            Ok(Released::Failed { before: record })
        }
        Err(IdemError::LeaseLost { .. }) => Ok(Released::LeaseLost {
            now: store.load(biz, key).await?,
        }),
        Err(e) => Err(e),
    }
}

/// The PROCESSING records whose lease ended (by the store's clock), across every business type
/// [`Store::stats`] finds with PROCESSING records, oldest lease first, at most `batch` of them:
/// [`Store::stuck`] for each business type.
///
/// # Errors
/// [`IdemError::NotSupported`] for a store that cannot count or list them (a Redis Cluster has
/// no stuck index); the store's errors.
pub async fn stuck_all(store: &dyn Store, batch: usize) -> Result<Vec<Record>, IdemError> {
    let mut stuck = Vec::new();
    for biz in store.processing_biz_types().await? {
        stuck.extend(store.stuck(&biz, batch).await?);
    }
    stuck.sort_by_key(|r| r.lease_until_ms);
    stuck.truncate(batch);
    Ok(stuck)
}

/// Deletes every expired record, `batch` at a time ([`Store::sweep_expired`] until it deletes
/// none), calling `progress` with the total deleted so far after each batch that deleted some.
/// Returns the total.
///
/// # Errors
/// The store's error (what was deleted before it stays deleted; `progress` has seen it).
pub async fn sweep(
    store: &dyn Store,
    batch: usize,
    mut progress: impl FnMut(u64),
) -> Result<u64, IdemError> {
    let mut total = 0u64;
    loop {
        let deleted = store.sweep_expired(batch.max(1)).await?;
        if deleted == 0 {
            return Ok(total);
        }
        total += deleted;
        progress(total);
    }
}

/// [`sweep`] for submit tokens: [`TokenStore::sweep_expired`] until it deletes none.
///
/// # Errors
/// As [`sweep`].
pub async fn sweep_tokens(
    tokens: &dyn TokenStore,
    batch: usize,
    mut progress: impl FnMut(u64),
) -> Result<u64, IdemError> {
    let mut total = 0u64;
    loop {
        let deleted = tokens.sweep_expired(batch.max(1)).await?;
        if deleted == 0 {
            return Ok(total);
        }
        total += deleted;
        progress(total);
    }
}

/// This machine's clock in milliseconds since the Unix epoch.
fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_checked() {
        assert!(check_reason("INC-42: gateway timed out").is_ok());
        assert!(check_reason(&"x".repeat(200)).is_ok());
        for bad in ["", "  ", "a\nb", "tab\there", &"x".repeat(201)] {
            assert!(
                matches!(check_reason(bad), Err(IdemError::InvalidOptions { .. })),
                "{bad:?}"
            );
        }
    }
}
