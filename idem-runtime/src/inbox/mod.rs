//! A consumer inbox: what a message consumer tells its broker after an idempotent handler ran.
//!
//! Brokers deliver at least once, so a consumer deduplicates, keyed by the message's **business
//! key** (an order number in the payload), never by the broker's message id, which changes when a
//! producer sends the same event again. The handler is an `#[idempotent]` fn (lease or transaction
//! mode, with a `recover` fn if it has one) or any future that calls one; [`Inbox::handle`] runs
//! it inside [`observe`](crate::metrics::observe) and derives a [`Verdict`] from how the call
//! ended:
//!
//! | The call | Verdict |
//! | --- | --- |
//! | returned a value: first run, replay of a duplicate, recovered | [`Verdict::Ack`] |
//! | in progress elsewhere, lease lost, mark failed, recover failed | [`Verdict::Requeue`] after [`InboxBuilder::busy_delay`] |
//! | the body failed (a business error), attempt below the maximum | [`Verdict::Requeue`], back-off from [`InboxBuilder::retry_delay`] |
//! | the body failed, attempt at [`InboxBuilder::max_attempts`] | [`Verdict::DeadLetter`] |
//! | another payload under a key already processed, a result that cannot be stored, a refusal that no retry changes (bad key, unknown store) | [`Verdict::DeadLetter`] |
//! | a store error that may pass (unavailable, busy) | [`Verdict::Requeue`] |
//! | the payload cannot be read | [`Verdict::DeadLetter`] at once, the handler not called |
//!
//! **Attempts are counted per key**: in lease mode by the record's own attempt number (a failed
//! record keeps it; a duplicate published under another message id counts on the same record),
//! and by the broker's delivery count where the broker keeps one (JetStream's `num_delivered`,
//! RabbitMQ's `x-delivery-count` on quorum queues); the larger of the two decides. In
//! transaction mode a failed body rolls its claim back, so only the broker's count remains.
//!
//! Defaults, each set on [`Inbox::builder`]: [`max_attempts`](InboxBuilder::max_attempts) 5,
//! [`busy_delay`](InboxBuilder::busy_delay) 500 ms, a back-off from
//! [`retry_delay`](InboxBuilder::retry_delay) 1 s doubling up to
//! [`max_retry_delay`](InboxBuilder::max_retry_delay) 60 s.
//!
//! ```
//! # use idem_runtime as idem;
//! # async fn demo() -> Result<(), idem::IdemError> {
//! use idem::inbox::{Inbox, Verdict};
//! use idem::{Call, MemoryStore};
//!
//! let store = MemoryStore::new();
//! let inbox = Inbox::builder().max_attempts(5).build()?;
//! let payload = br#"{"order_no":"ORD-1"}"#;
//! // `None`: this broker keeps no delivery count. The handler is keyed by the order number.
//! let handled = inbox
//!     .handle_json(payload, None, |msg: serde_json::Value| {
//!         let order_no = msg["order_no"].as_str().unwrap_or_default().to_owned();
//!         let store = &store;
//!         async move {
//!             Call::new("SHIP", &order_no)
//!                 .run(store, async { Ok::<_, idem::IdemError>(format!("shipped {order_no}")) })
//!                 .await
//!         }
//!     })
//!     .await;
//! assert_eq!(handled.verdict, Verdict::Ack);
//! # Ok(()) }
//! ```
//!
//! **Batches.** A broker that delivers in batches (a JetStream fetch, what a RabbitMQ prefetch
//! holds) is handled a batch at a time with [`Inbox::handle_batch`]: one batch claim for the
//! batch's keys and one batch of marks for its successes, each message's verdict as above.
//!
//! The adapters settle a verdict on a real broker: [`amqp`] (feature `rabbitmq`: `declare_queue`
//! makes a quorum queue with a `<queue>.dead` dead-letter queue; ack, nack with requeue after the
//! delay, reject to the dead letters) and [`jetstream`] (feature `nats`: ack, nak with the delay,
//! a copy to a dead-letter subject with the reason in a header, then term). Neither the handler
//! nor the consumer maps outcomes or verdicts by hand: `amqp::settle` and `jetstream::settle`
//! take the inbox's [`Verdict`].
//!
//! **An example consumer.** `examples/mq_consumer.rs` in the repository is a RabbitMQ
//! and NATS JetStream consumer built on this module: each delivery goes through
//! [`Inbox::handle_json`] to an `#[idempotent(biz = "ORDER", key = "msg.order_no", tx = "tx",
//! fingerprint = "msg")]` fn, so the key is the order number in the payload, and the claim and the
//! side effect (a row in its own table) commit in one SQLite transaction before the ack. A first
//! delivery and a duplicate are acked, a failure is requeued after a back-off and runs again, and
//! an unreadable payload, a blank order number or another payload under a shipped order are
//! dead-lettered. It publishes three orders twice each under distinct message ids, fails one
//! order once, kills its first consumer right after a shipment and before the ack, and exits
//! non-zero unless every order was shipped exactly once:
//!
//! ```sh
//! cargo run -p idem-suite --all-features --example mq_consumer -- rabbitmq   # IDEM_AMQP_URL, default amqp://guest:guest@127.0.0.1:5672/%2f
//! cargo run -p idem-suite --all-features --example mq_consumer -- nats       # IDEM_NATS_URL, default nats://127.0.0.1:4222
//! ```
//!
//! In the repository, `tests/tests/inbox_rabbitmq.rs` and `inbox_nats.rs` check every
//! verdict, attempts per key and by delivery count, and the dead letters on the real brokers;
//! `mq_rabbitmq.rs` and `mq_nats.rs` drive the example consumer's functions and check the
//! broker afterwards (queue empty, nothing pending or awaiting an ack, exactly the refused
//! messages among the dead letters).
//!
//! **Kafka** (feature `kafka`): `kafka::KafkaSettler` commits the offset after an ack, pauses the
//! partition and seeks it back to a requeued message after its delay (order per key holds), and
//! produces a dead letter to a topic of its own before committing; its module docs have a whole
//! consumer, the topics' creation included. Tested against a Kafka-compatible broker (tansu) in
//! `tests/tests/inbox_kafka.rs`.
//!
//! **What a consumer adds.** The adapters take the broker clients' types: the consumer depends on
//! the same major versions as idem (`lapin` 4, `async-nats` 0.51, `rdkafka` 0.39) and on
//! `futures-util` 0.3 for `StreamExt::next` over the client's deliveries. The messaging guide
//! (`docs/guide/messaging.md` in the repository; `idem::_guide::messaging` in the docs of the
//! `idemkit` package) builds a consumer on each broker with its queue, stream or topic, and the
//! producer side with the outbox.

#[cfg(feature = "rabbitmq")]
pub mod amqp;
#[cfg(feature = "nats")]
pub mod jetstream;
#[cfg(feature = "kafka")]
pub mod kafka;

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::metrics::Outcome;
use crate::{Batch, Call, IdemError, Store};

/// The most attempts [`InboxBuilder::max_attempts`] takes.
pub const MAX_ATTEMPTS: u32 = 1_000;

/// The longest delay [`InboxBuilder::busy_delay`], [`InboxBuilder::retry_delay`] and
/// [`InboxBuilder::max_retry_delay`] take: one hour.
pub const MAX_DELAY: Duration = Duration::from_secs(3_600);

/// What the consumer tells the broker about one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Done: the business ran once (now or in an earlier delivery); remove the message.
    Ack,
    /// Not done yet: deliver the message again after `delay`.
    Requeue {
        /// How long the broker should wait before the redelivery.
        delay: Duration,
    },
    /// Never going to succeed, or out of attempts: move the message to the dead letters.
    DeadLetter {
        /// Why, for the operator reading the dead letters (no key, no payload in it).
        reason: String,
    },
}

/// One delivery as the inbox handled it.
#[derive(Debug)]
pub struct Handled<T, E> {
    /// What to tell the broker.
    pub verdict: Verdict,
    /// How the idempotent call ended, when one ran.
    pub outcome: Option<Outcome>,
    /// The attempt this delivery counts as (the larger of the record's and the broker's count).
    pub attempts: u32,
    /// The handler's answer; `None` when the payload could not be read.
    pub result: Option<Result<T, E>>,
}

/// One message of a batch for [`Inbox::handle_batch`]: the call its handler makes (keyed by the
/// message's business key, with its fingerprint, lease and ttl), the broker's delivery count, and
/// the message itself, which the body gets.
#[derive(Debug)]
pub struct BatchMessage<M> {
    /// The idempotent call for this message.
    pub call: Call,
    /// The broker's delivery count, when it keeps one (1 for a first delivery).
    pub delivered: Option<u32>,
    /// The message, handed to the body.
    pub message: M,
}

impl<M> BatchMessage<M> {
    /// A message of a batch.
    pub fn new(call: Call, delivered: Option<u32>, message: M) -> Self {
        BatchMessage {
            call,
            delivered,
            message,
        }
    }
}

/// How a consumer maps handler outcomes to verdicts; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct Inbox {
    max_attempts: u32,
    busy_delay: Duration,
    retry_delay: Duration,
    max_retry_delay: Duration,
    store_timeout: Option<Duration>,
}

/// Builds an [`Inbox`]; every value is checked by [`build`](InboxBuilder::build).
#[derive(Debug, Clone)]
#[must_use]
pub struct InboxBuilder {
    inbox: Inbox,
}

impl Default for InboxBuilder {
    fn default() -> Self {
        InboxBuilder {
            inbox: Inbox {
                max_attempts: 5,
                busy_delay: Duration::from_millis(500),
                retry_delay: Duration::from_secs(1),
                max_retry_delay: Duration::from_secs(60),
                store_timeout: None,
            },
        }
    }
}

impl InboxBuilder {
    /// Attempts per key before a business error dead-letters the message: 1 to [`MAX_ATTEMPTS`]
    /// (default 5; 1 dead-letters at the first failure).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.inbox.max_attempts = attempts;
        self
    }

    /// The redelivery delay while another delivery of the same key is in progress: 0 to
    /// [`MAX_DELAY`] (default 500 ms).
    pub fn busy_delay(mut self, delay: Duration) -> Self {
        self.inbox.busy_delay = delay;
        self
    }

    /// The first redelivery delay after a business error, doubled for each attempt up to
    /// [`max_retry_delay`](Self::max_retry_delay): 0 to [`MAX_DELAY`] (default 1 s).
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.inbox.retry_delay = delay;
        self
    }

    /// The longest redelivery delay after a business error: `retry_delay` to [`MAX_DELAY`]
    /// (default 60 s).
    pub fn max_retry_delay(mut self, delay: Duration) -> Self {
        self.inbox.max_retry_delay = delay;
        self
    }

    /// The store timeout of the idempotent calls a handler makes that set none of their own
    /// (see [`Call::store_timeout`](crate::Call::store_timeout)): 1 ms ..=
    /// [`MAX_DURATION`](crate::MAX_DURATION) (default: theirs, 10 s). A store that does not
    /// answer in time is a retryable error, so the message is requeued rather than the consumer
    /// held.
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.inbox.store_timeout = Some(timeout);
        self
    }

    /// The inbox.
    ///
    /// # Errors
    /// [`IdemError::InvalidOptions`] naming the value out of its range.
    pub fn build(self) -> Result<Inbox, IdemError> {
        let inbox = self.inbox;
        let refuse = |reason: String| Err(IdemError::InvalidOptions { reason });
        if inbox.max_attempts == 0 || inbox.max_attempts > MAX_ATTEMPTS {
            return refuse(format!(
                "inbox max_attempts is 1 to {MAX_ATTEMPTS}, not {}",
                inbox.max_attempts
            ));
        }
        for (name, delay) in [
            ("busy_delay", inbox.busy_delay),
            ("retry_delay", inbox.retry_delay),
            ("max_retry_delay", inbox.max_retry_delay),
        ] {
            if delay > MAX_DELAY {
                return refuse(format!(
                    "inbox {name} is at most {MAX_DELAY:?}, not {delay:?}"
                ));
            }
        }
        if let Some(timeout) = inbox.store_timeout {
            crate::engine::check_store_timeout(timeout)?;
        }
        if inbox.max_retry_delay < inbox.retry_delay {
            return refuse(format!(
                "inbox max_retry_delay ({:?}) is shorter than retry_delay ({:?})",
                inbox.max_retry_delay, inbox.retry_delay
            ));
        }
        Ok(inbox)
    }
}

impl Inbox {
    /// A builder with the defaults: 5 attempts, 500 ms while busy, 1 s to 60 s after a failure.
    pub fn builder() -> InboxBuilder {
        InboxBuilder::default()
    }

    /// Attempts per key before a business error dead-letters the message.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Runs `handler` (a future that makes one idempotent call: an `#[idempotent]` fn, or code
    /// that begins a transaction, calls one and commits) and says what to tell the broker.
    /// `delivered` is the broker's delivery count of this message, when it keeps one (1 for a
    /// first delivery).
    ///
    /// A handler that returns `Ok` is acked only then: in transaction mode, commit inside the
    /// handler, so a failed commit is an `Err` and the message is delivered again.
    pub async fn handle<T, E, F>(&self, delivered: Option<u32>, handler: F) -> Handled<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: std::fmt::Display,
    {
        let (result, report) = match self.store_timeout {
            Some(timeout) => {
                crate::metrics::observe(crate::engine::with_store_timeout(timeout, handler)).await
            }
            None => crate::metrics::observe(handler).await,
        };
        let outcome = report.as_ref().map(|r| r.outcome);
        let record_attempt = report.as_ref().map_or(0, |r| r.attempt);
        let attempts = record_attempt.max(delivered.unwrap_or(0)).max(1);
        let verdict = match &result {
            Ok(_) => Verdict::Ack,
            Err(e) => self.verdict_for_error(
                outcome,
                report.as_ref().and_then(|r| r.retryable),
                attempts,
                e,
            ),
        };
        if matches!(verdict, Verdict::DeadLetter { .. }) {
            // The reason stays in the verdict: it quotes the handler's error, which may name the
            // key, and no event of idem's carries a key.
            tracing::warn!(?outcome, attempts, "message dead-lettered");
        }
        Handled {
            verdict,
            outcome,
            attempts,
            result: Some(result),
        }
    }

    /// Handles the messages of one broker batch (a JetStream fetch, the deliveries a RabbitMQ
    /// prefetch holds) with one batch claim ([`Batch`]: one round trip to `store` for every key
    /// of a business type) instead of one claim per message, then runs `body` for each message
    /// whose claim was acquired, one after the other in the batch's order, and says what to tell
    /// the broker about each, as [`handle`](Self::handle) would have: a duplicate (inside the
    /// batch or of an earlier one) replays and is acked, a key in progress elsewhere is requeued,
    /// a body that fails is requeued or dead-lettered by its own attempts, and frees only its own
    /// key. The verdicts come in the messages' order.
    ///
    /// A message that repeats a key of the batch runs after the others, with the other repeats
    /// (one more batch claim for them), once its key's earlier message is marked: it replays that
    /// answer. Messages of one key keep their order; messages of different keys may not.
    ///
    /// The successes' marks go together too ([`Store::complete_batch`]): after the last body of
    /// each round, or earlier when the oldest held-back mark's lease is a third gone. A message
    /// is acked only once its mark landed; one whose mark did not (another attempt took its key
    /// over, or the store failed past its lease) is requeued, and its key is decided by the next
    /// delivery. A consumer that dies after its bodies ran and before their marks landed leaves
    /// those keys PROCESSING, as a single call that died before its mark does: once the leases
    /// end, the next delivery takes each over and runs its body again, so the window is a round's
    /// bodies instead of one body's. A body whose effect must not repeat keeps it in
    /// [`step`](crate::step)s, or is handled with `handle` and a recover fn, or in transaction
    /// mode.
    ///
    /// Lease mode: `body` is the business itself (what an `#[idempotent]` fn's body does), run
    /// under the claim each message's [`Call`] made; a handler that needs its writes in the
    /// claim's transaction, or a recover fn, is handled one message at a time with `handle`. A
    /// message whose payload cannot be read is not part of the batch: answer it with
    /// [`unreadable`](Self::unreadable).
    ///
    /// ```
    /// # use idem_runtime as idem;
    /// # async fn demo() -> Result<(), idem::IdemError> {
    /// use idem::inbox::{BatchMessage, Inbox, Verdict};
    /// use idem::{Call, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let inbox = Inbox::builder().build()?;
    /// // Three deliveries, the third a duplicate of the first under another message id.
    /// let orders = ["ORD-1", "ORD-2", "ORD-1"];
    /// let batch = orders
    ///     .iter()
    ///     .map(|no| BatchMessage::new(Call::new("SHIP", no).fingerprint(no), Some(1), *no));
    /// let handled = inbox
    ///     .handle_batch(&store, batch, |no: &str| async move {
    ///         Ok::<_, idem::IdemError>(format!("shipped {no}"))
    ///     })
    ///     .await;
    /// assert!(handled.iter().all(|h| h.verdict == Verdict::Ack));
    /// # Ok(()) }
    /// ```
    pub async fn handle_batch<M, T, E, B, F>(
        &self,
        store: &dyn Store,
        messages: impl IntoIterator<Item = BatchMessage<M>>,
        mut body: B,
    ) -> Vec<Handled<T, E>>
    where
        B: FnMut(M) -> F,
        F: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<IdemError> + std::fmt::Display,
    {
        // Round r holds each key's r-th message: a repeat runs in the round after its key's
        // earlier message, whose mark has landed by then.
        let mut rounds: Vec<Vec<(usize, BatchMessage<M>)>> = Vec::new();
        let mut seen: std::collections::HashMap<(String, String), usize> = Default::default();
        let mut count = 0;
        for (i, m) in messages.into_iter().enumerate() {
            let round = seen
                .entry((m.call.biz().to_owned(), m.call.key().to_owned()))
                .or_insert(0);
            if rounds.len() <= *round {
                rounds.push(Vec::new());
            }
            rounds[*round].push((i, m));
            *round += 1;
            count = i + 1;
        }
        let mut handled: Vec<Option<Handled<T, E>>> = (0..count).map(|_| None).collect();
        let sink = crate::engine::MarkSink::default();
        for round in rounds {
            let mut calls = Vec::with_capacity(round.len());
            let mut rest = Vec::with_capacity(round.len());
            for (i, m) in round {
                calls.push(m.call);
                rest.push((i, m.delivered, m.message));
            }
            let batch = Batch::new(calls);
            let claimed = match self.store_timeout {
                Some(timeout) => {
                    crate::engine::with_store_timeout(timeout, batch.claim(store)).await
                }
                None => batch.claim(store).await,
            };
            for (claimed, (i, delivered, message)) in claimed.into_iter().zip(rest) {
                // A held-back mark whose lease is a third gone is sent before more bodies run.
                let due = sink
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .any(|(_, m)| m.lease_sent + m.lease / 3 <= tokio::time::Instant::now());
                if due {
                    self.flush_marks(store, &sink, &mut handled).await;
                }
                let run = claimed.deferring(&sink, i).run(body(message));
                handled[i] = Some(self.handle(delivered, run).await);
            }
            self.flush_marks(store, &sink, &mut handled).await;
        }
        handled
            .into_iter()
            .map(|h| h.expect("every message of the batch is handled"))
            .collect()
    }

    /// Sends the marks `handle_batch` held back and completes the answers of their messages:
    /// acked with the call's outcome once the mark landed, requeued (as a busy key) when it did
    /// not.
    async fn flush_marks<T, E>(
        &self,
        store: &dyn Store,
        sink: &crate::engine::MarkSink,
        handled: &mut [Option<Handled<T, E>>],
    ) where
        E: From<IdemError>,
    {
        let timeout = self
            .store_timeout
            .unwrap_or(crate::engine::DEFAULT_STORE_TIMEOUT);
        for (i, landed) in crate::engine::flush_marks(store, sink, timeout).await {
            let Some(Some(h)) = handled.get_mut(i) else {
                continue;
            };
            match landed {
                Ok((outcome, attempt)) => {
                    h.outcome = Some(outcome);
                    h.attempts = h.attempts.max(attempt);
                }
                Err(e) => {
                    h.outcome = Some(match e {
                        IdemError::LeaseLost { .. } => Outcome::LeaseLost,
                        _ => Outcome::MarkFailed,
                    });
                    h.verdict = Verdict::Requeue {
                        delay: self.busy_delay,
                    };
                    h.result = Some(Err(E::from(e)));
                }
            }
        }
    }

    /// [`handle`](Self::handle) for a JSON payload: decodes it as `M` and hands it to
    /// `handler`; a payload that is not an `M` is dead-lettered at once and the handler is not
    /// called.
    pub async fn handle_json<M, T, E, H, F>(
        &self,
        payload: &[u8],
        delivered: Option<u32>,
        handler: H,
    ) -> Handled<T, E>
    where
        M: serde::de::DeserializeOwned,
        H: FnOnce(M) -> F,
        F: Future<Output = Result<T, E>>,
        E: std::fmt::Display,
    {
        match serde_json::from_slice::<M>(payload) {
            Ok(message) => self.handle(delivered, handler(message)).await,
            Err(e) => self.unreadable(delivered, &e),
        }
    }

    /// The verdict for a payload that cannot be read (`error` says why): dead letter, at once.
    pub fn unreadable<T, E>(
        &self,
        delivered: Option<u32>,
        error: &dyn std::fmt::Display,
    ) -> Handled<T, E> {
        let reason = format!("unreadable payload: {error}");
        tracing::warn!(attempts = delivered, "unreadable message dead-lettered");
        Handled {
            verdict: Verdict::DeadLetter { reason },
            outcome: None,
            attempts: delivered.unwrap_or(1).max(1),
            result: None,
        }
    }

    fn verdict_for_error(
        &self,
        outcome: Option<Outcome>,
        retryable: Option<bool>,
        attempts: u32,
        error: &dyn std::fmt::Display,
    ) -> Verdict {
        let requeue = |delay| Verdict::Requeue { delay };
        let dead = |why: String| Verdict::DeadLetter { reason: why };
        match outcome {
            // Someone else is at it, or this attempt lost its claim: the key is not done, and it
            // is not this message's fault.
            Some(
                Outcome::InProgress
                | Outcome::LeaseLost
                | Outcome::MarkFailed
                | Outcome::RecoverFailed
                | Outcome::VersionConflict,
            ) => requeue(self.busy_delay),
            // Done in an earlier delivery, whose result is no longer kept: nothing to do again.
            Some(Outcome::ResultExpired) => Verdict::Ack,
            Some(Outcome::Mismatch) => {
                dead("another payload under a key already processed".to_owned())
            }
            Some(Outcome::Unstorable) => dead(format!("the result cannot be stored: {error}")),
            Some(Outcome::WrongState) => dead(format!("the state does not allow it: {error}")),
            Some(Outcome::Rejected) if retryable != Some(true) => {
                dead(format!("refused, and a retry would be too: {error}"))
            }
            Some(Outcome::Rejected) => requeue(self.busy_delay),
            // The body's own error, a missing row, an error after a successful call (a commit
            // that failed), or an error before any idempotent call: count the attempt.
            _ if attempts >= self.max_attempts => dead(format!(
                "failed {attempts} time{}: {error}",
                if attempts == 1 { "" } else { "s" }
            )),
            _ => requeue(self.back_off(attempts)),
        }
    }

    /// `retry_delay × 2^(attempts − 1)`, at most `max_retry_delay`.
    fn back_off(&self, attempts: u32) -> Duration {
        crate::duration::doubling(self.retry_delay, attempts, self.max_retry_delay)
    }
}

#[cfg(test)]
mod tests;
