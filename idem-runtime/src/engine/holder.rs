//! What the holder of a lease-mode claim does: runs the body while renewing its lease, then marks
//! the record, trying for as long as the lease protects the claim.
//!
//! A finished body whose mark does not land leaves its record PROCESSING, and once the lease ends
//! the next call takes over and runs the body again. So a mark that meets a store restart (refused
//! connections, connections the crash killed, a server busy recovering) keeps trying with jittered
//! back-off while the lease is live, less a margin, and the heartbeat keeps renewing meanwhile on
//! its schedule (for at most [`CARRY_LEASES`] leases); only then does the call give up
//! (`MarkFailed`).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use super::current::CallScope;
use super::step_log::{self as steps, Steps};
use super::{STORE_TIMEOUT, TRANSIENT_TRIES, Within, back_off_pause, current, retry_transient};
use crate::IdemError;
use crate::store::{Claim, ClaimRequest, Status, Store};

/// The part of the lease a mark leaves unused: a tenth of it, at most 1 s. A mark sent later could
/// land after another attempt took the record over.
fn margin(lease: Duration) -> Duration {
    const MOST: Duration = Duration::from_secs(1);
    // No division for a lease of 10 s or more (the default is 30 s).
    if lease >= MOST * 10 { MOST } else { lease / 10 }
}

/// When a lease sent at `sent` stops protecting a mark: its end less [`margin`].
fn safe_until(sent: Instant, lease: Duration) -> Option<Instant> {
    sent.checked_add(lease - margin(lease))
}

/// The holder of one claim: its store, its record, and when its lease ends by this process's
/// clock (counted from before the claim or the last renewal was sent, so never later than the
/// store's own end).
pub(crate) struct Holder<'a> {
    store: &'a dyn Store,
    req: &'a ClaimRequest<'a>,
    claim: Claim,
    /// The call, with the log of its steps (`call.steps` is always set in lease mode).
    call: Arc<CallScope>,
    heartbeat: Option<Duration>,
    /// The call's store timeout: the longest any one step (a renewal, a read, a mark with its
    /// tries) may wait for the store.
    timeout: Duration,
    /// When the lease's safe part ends by this clock: the lease's end less [`margin`] (`None`
    /// when that would be before the clock's start).
    safe_until: Option<Instant>,
    last_beat: Instant,
    renewing: bool,
}

impl<'a> Holder<'a> {
    /// The holder of `claim`, whose claim was sent at `claimed_at`.
    pub(crate) fn new(
        store: &'a dyn Store,
        req: &'a ClaimRequest<'a>,
        claim: Claim,
        call: Arc<CallScope>,
        heartbeat: Option<Duration>,
        timeout: Duration,
        claimed_at: Instant,
    ) -> Self {
        Holder {
            store,
            req,
            claim,
            call,
            heartbeat,
            timeout,
            safe_until: safe_until(claimed_at, req.lease),
            last_beat: claimed_at,
            renewing: true,
        }
    }

    /// Runs the body as the holder of the claim (see [`current::current_claim`]), renewing the
    /// lease every heartbeat while it runs, and reading and saving its steps when they ask.
    pub(crate) async fn run<F: Future>(&mut self, body: F) -> F::Output {
        let mut body = pin!(current::scope(self.claim, self.call.clone(), body));
        // A body that is done at its first poll (no I/O, a cache hit) needs no heartbeat timer:
        // arming and dropping one costs more than many such bodies.
        let first = std::future::poll_fn(|cx| Poll::Ready(body.as_mut().poll(cx))).await;
        if let Poll::Ready(out) = first {
            return out;
        }
        let call = self.call.clone();
        let steps = call.steps.as_ref();
        loop {
            let next_beat = self.heartbeat.map(|every| self.last_beat + every);
            tokio::select! {
                biased;
                out = &mut body => return out,
                () = async { steps.expect("guarded").wake.notified().await }, if steps.is_some() => {
                    self.serve(steps.expect("guarded")).await;
                }
                () = tokio::time::sleep_until(next_beat.unwrap_or_else(Instant::now)),
                    if self.renewing && next_beat.is_some() => self.beat().await,
            }
        }
    }

    /// Answers what the body's steps asked: reads the log saved under the record (once, after a
    /// takeover or a retry), then saves the log with the new steps in it, fenced, trying as a mark
    /// tries. One save covers every step that asked meanwhile.
    async fn serve(&mut self, steps: &Steps) {
        let (asks, unread) = steps.take_asks();
        if asks.is_empty() {
            return;
        }
        let mut read = self.still_held().await;
        if unread && read.is_ok() {
            read = self.read_steps().await.map(|log| steps.set_log(log));
        }
        let saves: Vec<&str> = asks.iter().filter_map(|a| a.save.as_deref()).collect();
        let saved = match &read {
            Err(e) => Err(copy_of(e)),
            Ok(()) if saves.is_empty() => Ok(()),
            Ok(()) => self.save_steps(steps, &saves).await,
        };
        for ask in asks {
            let answer = match if ask.save.is_some() { &saved } else { &read } {
                Ok(()) => Ok(()),
                Err(e) => Err(copy_of(e)),
            };
            // A step whose future was dropped does not wait for its answer.
            let _ = ask.reply.send(answer);
        }
    }

    /// Whether the claim is still this call's, before a step's work: refused once a heartbeat
    /// found it taken over; confirmed with one fenced renewal once the lease's safe part has
    /// passed (a holder that paused); otherwise known without a round trip.
    async fn still_held(&mut self) -> Result<(), IdemError> {
        if !self.renewing {
            return Err(IdemError::LeaseLost {
                attempt: self.claim.attempt,
            });
        }
        self.confirm().await
    }

    /// The log saved under the record this call holds.
    async fn read_steps(&mut self) -> Result<steps::Log, IdemError> {
        let (store, req, claim) = (self.store, self.req, self.claim);
        let (until, why) = self.cut_off(super::after(self.timeout));
        let record = retry_transient(until, why, || store.load(req.biz, req.key))
            .await
            .map_err(|e| e.during("read of the recovery points"))?;
        match record {
            Some(r) if r.fence == claim.fence && r.status == Status::Processing => {
                steps::decode_log(r.steps.as_deref())
            }
            _ => Err(IdemError::LeaseLost {
                attempt: claim.attempt,
            }),
        }
    }

    /// Saves the log, which now holds the steps `saves`.
    async fn save_steps(&mut self, steps: &Steps, saves: &[&str]) -> Result<(), IdemError> {
        let blob = steps.encoded();
        let limit = self.store.limits().max_snapshot_len;
        if blob.len() > limit {
            steps.forget(saves);
            return Err(IdemError::Step {
                step: saves.join(", "),
                reason: format!(
                    "the step ran, but the saved steps would be {} bytes, more than the store's \
                     snapshot limit of {limit}: save less (an id, not a document)",
                    blob.len()
                ),
            });
        }
        let (store, req, claim) = (self.store, self.req, self.claim);
        self.finish(|| store.save_steps(req.biz, req.key, &claim, &blob))
            .await
    }

    /// Renews the lease once, trying a transient error again as a claim is tried, cut off when
    /// the lease's time or the store timeout is up. The lease is counted from before the first try.
    async fn beat(&mut self) {
        let sent = Instant::now();
        self.last_beat = sent;
        let (store, req, claim) = (self.store, self.req, self.claim);
        let (until, why) = self.cut_off(super::after(self.timeout));
        let renew = || store.renew(req.biz, req.key, &claim, req.lease);
        match retry_transient(until, why, renew).await {
            Ok(()) => self.safe_until = safe_until(sent, req.lease),
            Err(e @ IdemError::LeaseLost { .. }) => {
                tracing::error!(attempt = claim.attempt, error = %e, "heartbeat found the claim taken over; the result will not be stored");
                self.renewing = false;
            }
            Err(e) => {
                tracing::warn!(attempt = claim.attempt, error = %e, "heartbeat could not renew the lease; trying again at the next beat");
            }
        }
    }

    /// Before anything runs: a claim whose reply came back (or whose task got to run) only after
    /// its lease's safe part had passed may have been taken over meanwhile; one fenced renewal
    /// says whether it is still ours, and extends it. A claim still inside its lease needs
    /// nothing (the common case: no round trip).
    ///
    /// # Errors
    /// `LeaseLost` when another attempt took it over; a store error when the renewal could not
    /// tell. Either way nothing must run.
    pub(crate) async fn confirm(&mut self) -> Result<(), IdemError> {
        self.confirm_at(Instant::now()).await
    }

    /// [`Holder::confirm`] as of `now`: when the claim's answer came back, read by the caller,
    /// or later.
    pub(crate) async fn confirm_at(&mut self, now: Instant) -> Result<(), IdemError> {
        if self.time_left_at(now).is_some() {
            return Ok(());
        }
        let sent = Instant::now();
        let (store, req, claim) = (self.store, self.req, self.claim);
        let renew = || store.renew(req.biz, req.key, &claim, req.lease);
        retry_transient(super::after(self.timeout), STORE_TIMEOUT, renew).await?;
        self.safe_until = safe_until(sent, req.lease);
        self.last_beat = sent;
        Ok(())
    }

    /// When the claim's lease was last sent (claimed or renewed), by this process's clock.
    pub(crate) fn lease_sent(&self) -> Instant {
        self.last_beat
    }

    /// How long the claim stays safely ours: until the lease ends less the margin; `None` once
    /// that moment has passed.
    fn time_left(&self) -> Option<Duration> {
        self.time_left_at(Instant::now())
    }

    /// When a step sent now must have its answer: at `give_up` (the store timeout's end), or at
    /// the lease's safe end if that comes first and has not passed; with what runs out then.
    fn cut_off(&self, give_up: Option<Instant>) -> (Option<Instant>, &'static str) {
        self.cut_off_at(Instant::now(), give_up)
    }

    /// [`Holder::cut_off`] as of `now`.
    fn cut_off_at(
        &self,
        now: Instant,
        give_up: Option<Instant>,
    ) -> (Option<Instant>, &'static str) {
        match (self.safe_until.filter(|&end| end > now), give_up) {
            (Some(end), Some(give_up)) if end < give_up => (Some(end), "the claim's lease"),
            (Some(end), None) => (Some(end), "the claim's lease"),
            (_, give_up) => (give_up, STORE_TIMEOUT),
        }
    }

    /// [`Holder::time_left`] as of `now`.
    fn time_left_at(&self, now: Instant) -> Option<Duration> {
        let left = self.safe_until?.saturating_duration_since(now);
        (!left.is_zero()).then_some(left)
    }

    /// Finishes the claim with `mark` (complete or fail), trying again after a transient store
    /// error for as long as the lease is live (and at least [`TRANSIENT_TRIES`] times in all),
    /// within the call's store timeout from the first try. Each try is cut off when the lease's
    /// time or the store timeout is up, whichever comes first (after the lease's safe end, the
    /// store timeout alone bounds it).
    ///
    /// While the mark fails, the heartbeat keeps renewing the lease on its schedule (a pause
    /// between tries ends when a beat is due), for at most [`CARRY_LEASES`] leases from the
    /// first try: then no renewal is sent, and the call gives up before the lease's safe end, so
    /// a mark that never lands (while renewals do) cannot hold the caller forever.
    ///
    /// # Errors
    /// The mark's error: `LeaseLost`, a permanent store error, or the last transient one once the
    /// lease's time or the store timeout is up.
    pub(crate) async fn finish<F, Fut>(&mut self, mut mark: F) -> Result<(), IdemError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), IdemError>> + Unpin,
    {
        let mut tried = 0u32;
        let mut carry_until = None;
        let mut first_try = None;
        loop {
            let now = Instant::now();
            // The store timeout counts from the first try (one clock read for both).
            let give_up = *first_try.get_or_insert_with(|| now.checked_add(self.timeout));
            let (until, why) = self.cut_off_at(now, give_up);
            let e = match Within::new(until, why, mark()).await {
                Err(e) if e.is_transient_store_error() => e,
                done => return done,
            };
            tried += 1;
            if (tried >= TRANSIENT_TRIES && self.time_left().is_none())
                || give_up.is_some_and(|end| Instant::now() >= end)
            {
                return Err(e);
            }
            tracing::debug!(error = %e, tried, "transient store error on the mark; trying again while the lease is live");
            let carry_until = *carry_until.get_or_insert_with(|| {
                let carry = self.req.lease.checked_mul(CARRY_LEASES);
                carry.and_then(|carry| now.checked_add(carry))
            });
            let beat_every = self
                .heartbeat
                .filter(|_| self.renewing && carry_until.is_none_or(|end| Instant::now() < end));
            if let Some(every) = beat_every
                && self.last_beat.elapsed() >= every
            {
                self.beat().await;
            }
            let mut nap = back_off_pause(tried);
            if let Some(left) = self.time_left() {
                nap = nap.min(left);
            }
            if let Some(end) = give_up {
                nap = nap.min(end.saturating_duration_since(Instant::now()));
            }
            if let Some(every) = beat_every.filter(|_| self.renewing) {
                nap = nap.min((self.last_beat + every).saturating_duration_since(Instant::now()));
            }
            tokio::time::sleep(nap).await;
        }
    }
}

/// How many leases, counted from a mark's first failed try, the heartbeat keeps renewing the
/// claim while its mark keeps failing (a store restart outlasts a short lease; a mark that
/// never lands while renewals do must still end).
pub(crate) const CARRY_LEASES: u32 = 3;

/// `e` again, for each of several steps that wait on one read or save: the same variant where
/// it carries no source, the same class (unavailable, busy, other) with its message otherwise.
fn copy_of(e: &IdemError) -> IdemError {
    match e {
        IdemError::LeaseLost { attempt } => IdemError::LeaseLost { attempt: *attempt },
        IdemError::Step { step, reason } => IdemError::Step {
            step: step.clone(),
            reason: reason.clone(),
        },
        IdemError::StoreUnavailable { .. } => IdemError::unavailable(e.to_string()),
        IdemError::StoreBusy { reason, .. } => IdemError::busy(*reason, e.to_string()),
        _ => IdemError::store(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_margin_is_a_tenth_of_the_lease_up_to_a_second() {
        assert_eq!(
            margin(Duration::from_millis(300)),
            Duration::from_millis(30)
        );
        assert_eq!(margin(Duration::from_secs(20)), Duration::from_secs(1));
        assert_eq!(margin(Duration::from_millis(1)), Duration::from_micros(100));
        assert_eq!(margin(Duration::from_secs(10)), Duration::from_secs(1));
        assert_eq!(
            margin(Duration::from_millis(9_990)),
            Duration::from_millis(999)
        );
    }
}
