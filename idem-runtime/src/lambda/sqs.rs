//! SQS batches handled once per key, answering a partial batch response that lists only the
//! records to deliver again.
//!
//! An SQS event source mapping with `ReportBatchItemFailures` deletes every record of a batch
//! but those the function lists in its [`SqsBatchResponse`]. [`SqsBatch::handle`] makes one batch
//! claim for the batch's keys ([`Batch`](crate::batch::Batch), as [`Inbox::handle_batch`] does), runs
//! the body for each record whose key it acquired, sends the successes' marks together, and
//! lists:
//!
//! | The record | Listed (delivered again) |
//! | --- | --- |
//! | its body ran and returned `Ok`, its mark landed | no |
//! | a duplicate of a key done before, in this batch or an earlier one | no (the first answer stands) |
//! | its body failed | yes: SQS delivers it again after the visibility timeout, and after `maxReceiveCount` moves it to the queue's dead-letter queue |
//! | its key is in progress in another invocation | yes |
//! | its mark did not land (lease lost, store down) | yes |
//! | its body cannot be read (`handle_json`), its key is refused (empty, too long), or its payload differs from the key's first one (`validate_body`) | yes, until the redrive policy dead-letters it |
//!
//! A body that fails frees only its own key; the records that succeeded are not run again when
//! SQS delivers the listed ones. Repeats of one key inside a batch run after their key's first
//! record and get its answer. **FIFO queues** (an event source ARN ending in `.fifo`) keep their
//! order: records are handled one at a time, and from the first record listed on, every later
//! record of the batch is listed without being run, as AWS requires.
//!
//! Each record's lease is the invocation's remaining time (see the [module docs](super)).
//!
//! ```no_run
//! # use idem_runtime as idem;
//! use idem::lambda::events::sqs::{SqsBatchResponse, SqsEvent};
//! use idem::lambda::lambda_runtime::{self, LambdaEvent, service_fn};
//! use idem::lambda::sqs::SqsBatch;
//!
//! #[derive(serde::Deserialize)]
//! struct Shipment { order_no: String }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_runtime::Error> {
//!     let store = idem::DynamoStore::connect("dynamodb://idem_records").await?;
//!     let batch = &*Box::leak(Box::new(SqsBatch::builder(store, "SHIP").build()?));
//!     lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| async move {
//!         let response: SqsBatchResponse = batch
//!             .handle_json(
//!                 event,
//!                 |s: &Shipment| s.order_no.clone(),
//!                 |s: Shipment| async move { Ok::<_, idem::IdemError>(format!("shipped {}", s.order_no)) },
//!             )
//!             .await;
//!         Ok::<_, lambda_runtime::Error>(response)
//!     }))
//!     .await
//! }
//! ```

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use lambda_runtime::{Context, LambdaEvent};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::inbox::{BatchMessage, Inbox, Verdict};
use crate::{Call, IdemError, IdemKey, IntoSharedStore, Store};

/// The attribute SQS counts a record's deliveries in.
const RECEIVE_COUNT: &str = "ApproximateReceiveCount";

/// Handles SQS batches once per key; see the [module docs](self). Built with
/// [`SqsBatch::builder`].
#[derive(Clone)]
pub struct SqsBatch {
    store: Arc<dyn Store>,
    biz: Cow<'static, str>,
    ttl: Option<Duration>,
    validate_body: bool,
    inbox: Inbox,
}

impl fmt::Debug for SqsBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsBatch")
            .field("biz", &self.biz)
            .field("store", &self.store.backend())
            .field("ttl", &self.ttl)
            .field("validate_body", &self.validate_body)
            .finish()
    }
}

/// Builds an [`SqsBatch`]; [`build`](SqsBatchBuilder::build) checks every value.
#[must_use]
pub struct SqsBatchBuilder {
    batch: SqsBatch,
}

impl fmt::Debug for SqsBatchBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.batch.fmt(f)
    }
}

impl SqsBatch {
    /// A batch handler on `store`, its records' keys under the business type `biz`.
    pub fn builder(
        store: impl IntoSharedStore,
        biz: impl Into<Cow<'static, str>>,
    ) -> SqsBatchBuilder {
        SqsBatchBuilder {
            batch: SqsBatch {
                store: store.into_shared(),
                biz: biz.into(),
                ttl: None,
                validate_body: false,
                inbox: Inbox::builder()
                    .build()
                    .expect("the inbox's defaults are in range"),
            },
        }
    }
}

impl SqsBatchBuilder {
    /// How long a key's record is kept (the default: [`DEFAULT_TTL`](crate::DEFAULT_TTL), 7
    /// days). Range: longer than [`MAX_INVOCATION`](super::MAX_INVOCATION) (15 minutes) ..=
    /// [`MAX_DURATION`](crate::MAX_DURATION), checked by `build`.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.batch.ttl = Some(ttl);
        self
    }

    /// Fingerprints each record's body: a record whose key was done with another body is listed
    /// (a payload mismatch) instead of getting the first answer. Off by default: a producer that
    /// sends an event again may change a field (a timestamp) of an event that is the same.
    pub fn validate_body(mut self) -> Self {
        self.batch.validate_body = true;
        self
    }

    /// The batch handler, its options checked.
    ///
    /// # Errors
    /// [`IdemError::InvalidBiz`] for a business type the store cannot take;
    /// [`IdemError::InvalidOptions`] for a ttl out of range.
    pub fn build(self) -> Result<SqsBatch, IdemError> {
        let batch = self.batch;
        crate::key::validate_biz(&batch.biz, batch.store.limits().max_biz_len)?;
        if let Some(ttl) = batch.ttl {
            super::check_ttl(ttl)?;
        }
        Ok(batch)
    }
}

/// One record, ready to run: its id, SQS's receive count, and its message or why it cannot be
/// read.
struct Record<M> {
    id: String,
    delivered: Option<u32>,
    body: Option<String>,
    message: Result<M, String>,
}

impl SqsBatch {
    /// Handles `event`'s records: each record's key is `key(&record)`, and `body(record)` runs
    /// once per key. Returns the records to deliver again (see the [module docs](self)).
    pub async fn handle<K, R, B, F, T, Err>(
        &self,
        event: LambdaEvent<SqsEvent>,
        key: K,
        body: B,
    ) -> SqsBatchResponse
    where
        K: Fn(&SqsMessage) -> R,
        R: IdemKey,
        B: FnMut(SqsMessage) -> F,
        F: Future<Output = Result<T, Err>>,
        T: Serialize + DeserializeOwned,
        Err: From<IdemError> + fmt::Display,
    {
        self.run(read(event, |m| Ok(m.clone())), key, body).await
    }

    /// As [`handle`](Self::handle), each record's body read as JSON into an `M` first: a body
    /// that is not an `M` is listed without running anything. The key is `key(&message)`.
    pub async fn handle_json<M, K, R, B, F, T, Err>(
        &self,
        event: LambdaEvent<SqsEvent>,
        key: K,
        body: B,
    ) -> SqsBatchResponse
    where
        M: DeserializeOwned,
        K: Fn(&M) -> R,
        R: IdemKey,
        B: FnMut(M) -> F,
        F: Future<Output = Result<T, Err>>,
        T: Serialize + DeserializeOwned,
        Err: From<IdemError> + fmt::Display,
    {
        let records = read(event, |m| {
            serde_json::from_str(m.body.as_deref().unwrap_or_default())
                .map_err(|e| format!("the record's body is not the message expected: {e}"))
        });
        self.run(records, key, body).await
    }

    /// Runs the records (see the [module docs](self)) and lists those not acked.
    async fn run<M, K, R, B, F, T, Err>(
        &self,
        (records, context, fifo): (Vec<Record<M>>, Context, bool),
        key: K,
        mut body: B,
    ) -> SqsBatchResponse
    where
        K: Fn(&M) -> R,
        R: IdemKey,
        B: FnMut(M) -> F,
        F: Future<Output = Result<T, Err>>,
        T: Serialize + DeserializeOwned,
        Err: From<IdemError> + fmt::Display,
    {
        let mut listed = Vec::new();
        let mut ready = Vec::with_capacity(records.len());
        for Record {
            id,
            delivered,
            body: text,
            message,
        } in records
        {
            match message {
                // A FIFO batch stops at its first record listed: the rest wait their turn.
                _ if fifo && !listed.is_empty() => listed.push(id),
                Err(why) => {
                    tracing::warn!(reason = %why, "SQS record listed as failed: unreadable");
                    listed.push(id);
                }
                Ok(message) => {
                    let call = self.call_for(text.as_deref(), &message, &key, &context);
                    if fifo {
                        let store = &*self.store;
                        let run = call.run(store, body(message));
                        if self.inbox.handle(delivered, run).await.verdict != Verdict::Ack {
                            listed.push(id);
                        }
                    } else {
                        ready.push((id, BatchMessage::new(call, delivered, message)));
                    }
                }
            }
        }
        if !ready.is_empty() {
            let (ids, messages): (Vec<_>, Vec<_>) = ready.into_iter().unzip();
            let handled = self
                .inbox
                .handle_batch(&*self.store, messages, &mut body)
                .await;
            for (id, handled) in ids.into_iter().zip(handled) {
                if handled.verdict != Verdict::Ack {
                    listed.push(id);
                }
            }
        }
        let mut response = SqsBatchResponse::default();
        for id in listed {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id;
            response.batch_item_failures.push(failure);
        }
        response
    }

    /// The call a record makes.
    fn call_for<M, K, R>(&self, text: Option<&str>, message: &M, key: &K, context: &Context) -> Call
    where
        K: Fn(&M) -> R,
        R: IdemKey,
    {
        let mut call = super::call(self.biz.clone(), &key(message), context);
        if let Some(ttl) = self.ttl {
            call = call.ttl(ttl);
        }
        if self.validate_body {
            call = call.fingerprint(text.unwrap_or_default());
        }
        call
    }
}

/// The records of `event`, each message decoded by `decode`, the invocation's context, and
/// whether the batch is from a FIFO queue.
fn read<M>(
    event: LambdaEvent<SqsEvent>,
    decode: impl Fn(&SqsMessage) -> Result<M, String>,
) -> (Vec<Record<M>>, Context, bool) {
    let (event, context) = event.into_parts();
    let fifo = event.records.iter().any(|r| {
        r.event_source_arn
            .as_deref()
            .is_some_and(|arn| arn.ends_with(".fifo"))
    });
    let records = event
        .records
        .into_iter()
        .map(|m| Record {
            message: decode(&m),
            id: m.message_id.clone().unwrap_or_default(),
            delivered: m.attributes.get(RECEIVE_COUNT).and_then(|n| n.parse().ok()),
            body: m.body,
        })
        .collect();
    (records, context, fifo)
}
