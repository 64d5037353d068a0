//! The inbox on Kafka (`rdkafka`, feature `kafka`): a consumer group's messages through the
//! inbox, each [`Verdict`] settled the Kafka way by a [`KafkaSettler`].
//!
//! Kafka has no per-message ack: a consumer commits the offset it has reached in each partition.
//! So:
//!
//! - [`Verdict::Ack`] commits the message's offset (the next one to read), once the handler's
//!   record is final: a consumer killed between the two leaves the offset uncommitted, the
//!   message comes again (to this consumer or, after a rebalance, another), and the inbox
//!   replays the record instead of running the handler twice.
//! - [`Verdict::Requeue`] does not commit: the settler pauses the message's partition and, after
//!   the delay, seeks it back to the message and resumes it, so the message is read again and
//!   order per key (per partition) holds. The partition waits meanwhile (the other partitions do
//!   not); the inbox's attempt limit ([`InboxBuilder::max_attempts`](super::InboxBuilder::max_attempts))
//!   bounds how long, since past it the message is dead-lettered and the partition moves on. A
//!   retry topic would free the partition but break the order of a key's messages, which the
//!   inbox's handlers rely on (an order's creation before its cancellation).
//! - [`Verdict::DeadLetter`] produces a copy to the dead-letter topic (the key, the payload, the
//!   headers, and [`REASON_HEADER`] and [`ORIGIN_HEADER`]), waits for the broker's
//!   acknowledgement, then commits. Without a dead-letter topic it commits only (the log has the
//!   reason). A consumer that dies between the two produces the dead letter again when the
//!   message comes back: dead letters are at least once, and [`ORIGIN_HEADER`] tells two copies
//!   of one apart from two dead letters. (Kafka transactions would make the copy and the commit
//!   one; the broker these adapters are tested against has none.)
//!
//! Kafka keeps no delivery count, so the settler counts the deliveries of each message in this
//! process ([`KafkaSettler::admit`] gives the number to [`Inbox::handle`](super::Inbox::handle));
//! in lease mode the record's own attempt number counts across processes as well.
//!
//! The key is the business key in the payload, as on every broker; when a payload carries none,
//! [`offset_key`] (`topic/partition/offset`) names a record exactly (a producer's resend gets a
//! new offset, so that key deduplicates redeliveries only).
//!
//! **Topics.** Create the work topic and its dead-letter topic before the first consumer or
//! producer runs: a broker that creates topics on first use (`auto.create.topics.enable`) gives
//! them its default partition count, and would make the dead-letter topic only when the first
//! poison message arrives. Order holds per partition, and a requeued message holds its partition
//! back until its delay passes: more partitions, less waiting behind one message.
//!
//! A consumer with its topics and a real handler: it books one parcel per order number, however
//! often the order is delivered (the handler is a [`Call`](crate::Call) here; an `#[idempotent]`
//! fn works the same). Besides idem it needs `rdkafka` (0.39, the version idem is built with),
//! `futures-util` (0.3, for `StreamExt::next`), `serde` and `tokio`.
//!
//! ```no_run
//! # use idem_runtime as idem;
//! use std::sync::Arc;
//!
//! use futures_util::StreamExt;
//! use idem::inbox::Inbox;
//! use idem::inbox::kafka::{self, KafkaSettler};
//! use idem::{Call, IdemError, Store};
//! use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
//! use rdkafka::client::DefaultClientContext;
//! use rdkafka::consumer::{Consumer, StreamConsumer};
//! use rdkafka::producer::FutureProducer;
//! use rdkafka::types::RDKafkaErrorCode;
//! use rdkafka::{ClientConfig, Message};
//! use serde::{Deserialize, Serialize};
//!
//! type BoxError = Box<dyn std::error::Error + Send + Sync>;
//!
//! /// The event as published: the same order published twice carries the same order number.
//! #[derive(Serialize, Deserialize)]
//! struct OrderPlaced {
//!     order_no: String,
//!     item: String,
//!     qty: u32,
//! }
//!
//! /// Books one parcel per order number; another payload under a shipped order is refused
//! /// (and dead-lettered), an error of the carrier is requeued with back-off.
//! async fn ship(store: &dyn Store, order: OrderPlaced) -> Result<String, IdemError> {
//!     Call::new("SHIP", &order.order_no)
//!         .fingerprint(&order)
//!         .run(store, async {
//!             // carrier.book(&order.item, order.qty).await?: runs at most once per order number
//!             Ok(format!("parcel for {}: {} x{}", order.order_no, order.item, order.qty))
//!         })
//!         .await
//! }
//!
//! /// The work topic and its dead-letter topic; one that exists already is left as it is.
//! async fn create_topics(brokers: &str) -> Result<(), BoxError> {
//!     let admin: AdminClient<DefaultClientContext> =
//!         ClientConfig::new().set("bootstrap.servers", brokers).create()?;
//!     let topics = [
//!         NewTopic::new("orders", 6, TopicReplication::Fixed(3)),
//!         NewTopic::new("orders.dead", 1, TopicReplication::Fixed(3)),
//!     ];
//!     for created in admin.create_topics(&topics, &AdminOptions::new()).await? {
//!         match created {
//!             Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
//!             Err((topic, e)) => return Err(format!("cannot create {topic}: {e}").into()),
//!         }
//!     }
//!     Ok(())
//! }
//!
//! async fn consume(store: &dyn Store, inbox: &Inbox, brokers: &str) -> Result<(), BoxError> {
//!     create_topics(brokers).await?;
//!     let consumer: StreamConsumer = kafka::consumer_config(brokers, "shipping").create()?;
//!     consumer.subscribe(&["orders"])?;
//!     let consumer = Arc::new(consumer);
//!     let producer: FutureProducer = ClientConfig::new()
//!         .set("bootstrap.servers", brokers)
//!         .set("enable.idempotence", "true")
//!         .create()?;
//!     let settler = KafkaSettler::new(Arc::clone(&consumer)).dead_letters("orders.dead", producer);
//!     let mut messages = consumer.stream();
//!     while let Some(message) = messages.next().await {
//!         let message = message?;
//!         // `None`: a message fetched before its partition was rewound; it comes again.
//!         let Some(delivered) = settler.admit(&message) else { continue };
//!         let payload = message.payload().unwrap_or_default();
//!         let handled = inbox
//!             .handle_json(payload, Some(delivered), |order: OrderPlaced| ship(store, order))
//!             .await;
//!         settler.settle(&message, &handled.verdict).await?;
//!     }
//!     Ok(())
//! }
//! ```
//!
//! The same topics from an Apache Kafka installation's tools:
//! `kafka-topics.sh --bootstrap-server HOST:9092 --create --if-not-exists --topic orders
//! --partitions 6 --replication-factor 3`, and `orders.dead` with one partition.
//!
//! The broker these adapters are tested against is tansu, a Kafka-compatible broker, not Apache
//! Kafka: consumer groups, offset commits, pause, seek, headers and the idempotent producer are
//! what the tests use, and what a Kafka broker of version 0.11 or later also has.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{
    CommitMode, Consumer, ConsumerContext, DefaultConsumerContext, StreamConsumer,
};
use rdkafka::message::{BorrowedMessage, Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use super::Verdict;
use crate::BoxError;

/// The header a dead letter carries its reason in.
pub const REASON_HEADER: &str = "idem-dead-letter-reason";

/// The header a dead letter names its original in: `topic/partition/offset`.
pub const ORIGIN_HEADER: &str = "idem-origin";

/// The most messages whose deliveries a settler counts at once; past it the counts restart (the
/// record's own attempt number still counts in lease mode).
const MAX_COUNTED: usize = 100_000;

/// `topic/partition/offset`: the key of a message whose payload carries no business key.
pub fn offset_key<M: Message>(message: &M) -> String {
    format!(
        "{}/{}/{}",
        message.topic(),
        message.partition(),
        message.offset()
    )
}

/// A consumer's configuration as the settler needs it: `bootstrap_servers`, the consumer group
/// `group`, offsets committed by the settler only (`enable.auto.commit=false`), a new group
/// reading from the earliest offset. Add your own settings, then `.create()`.
pub fn consumer_config(bootstrap_servers: &str, group: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap_servers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest");
    config
}

type Partition = (String, i32);

#[derive(Default)]
struct State {
    /// Partitions paused for a requeued message, until the seek back to it is done: a message
    /// of theirs fetched before the pause is not handled (the seek brings it back in order).
    rewinding: HashMap<Partition, i64>,
    /// Deliveries of each message `(topic, partition, offset)` in this process.
    deliveries: HashMap<(String, i32, i64), u32>,
}

/// Settles the inbox's verdicts on a consumer group's consumer (see [the module](self)).
pub struct KafkaSettler<C: ConsumerContext + 'static = DefaultConsumerContext> {
    consumer: Arc<StreamConsumer<C>>,
    dead_letters: Option<(String, FutureProducer)>,
    state: Arc<Mutex<State>>,
    timeout: Duration,
}

impl<C: ConsumerContext + 'static> KafkaSettler<C> {
    /// A settler for `consumer` (made with `enable.auto.commit=false`:
    /// [`consumer_config`]); dead letters are only committed until
    /// [`dead_letters`](Self::dead_letters).
    pub fn new(consumer: Arc<StreamConsumer<C>>) -> Self {
        KafkaSettler {
            consumer,
            dead_letters: None,
            state: Arc::default(),
            timeout: Duration::from_secs(30),
        }
    }

    /// Dead letters are produced to `topic` by `producer` before their offset is committed.
    pub fn dead_letters(mut self, topic: impl Into<String>, producer: FutureProducer) -> Self {
        self.dead_letters = Some((topic.into(), producer));
        self
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether to handle `message`, and which delivery of it this is (1 for the first in this
    /// process): `None` for a message of a partition being rewound to a requeued message, which
    /// was fetched before the rewind and comes again after it; skip it.
    pub fn admit<M: Message>(&self, message: &M) -> Option<u32> {
        let mut state = self.state();
        let partition = (message.topic().to_owned(), message.partition());
        if state.rewinding.contains_key(&partition) {
            return None;
        }
        if state.deliveries.len() >= MAX_COUNTED {
            state.deliveries.clear();
        }
        let count = state
            .deliveries
            .entry((partition.0, partition.1, message.offset()))
            .or_insert(0);
        *count += 1;
        Some(*count)
    }

    /// Tells Kafka the verdict: see [the module](self).
    ///
    /// # Errors
    /// The commit's or the dead letter's error (the message then comes again: after a restart or
    /// a rebalance, from the last committed offset).
    pub async fn settle(
        &self,
        message: &BorrowedMessage<'_>,
        verdict: &Verdict,
    ) -> Result<(), BoxError> {
        match verdict {
            Verdict::Ack => self.commit(message),
            Verdict::DeadLetter { reason } => {
                match &self.dead_letters {
                    Some((topic, producer)) => {
                        self.dead_letter(message, reason, topic, producer).await?;
                    }
                    None => tracing::warn!(
                        origin = %offset_key(message),
                        %reason,
                        "dead letter dropped: the settler has no dead-letter topic"
                    ),
                }
                self.commit(message)
            }
            Verdict::Requeue { delay } => self.rewind(message, *delay),
        }
    }

    fn commit(&self, message: &BorrowedMessage<'_>) -> Result<(), BoxError> {
        self.state().deliveries.remove(&(
            message.topic().to_owned(),
            message.partition(),
            message.offset(),
        ));
        self.consumer.commit_message(message, CommitMode::Async)?;
        Ok(())
    }

    async fn dead_letter(
        &self,
        message: &BorrowedMessage<'_>,
        reason: &str,
        topic: &str,
        producer: &FutureProducer,
    ) -> Result<(), BoxError> {
        let mut headers = OwnedHeaders::new();
        if let Some(original) = message.headers() {
            for header in original.iter() {
                if header.key != REASON_HEADER && header.key != ORIGIN_HEADER {
                    headers = headers.insert(header);
                }
            }
        }
        let reason = reason.replace(['\r', '\n'], " ");
        let origin = offset_key(message);
        let headers = headers
            .insert(Header {
                key: REASON_HEADER,
                value: Some(&reason),
            })
            .insert(Header {
                key: ORIGIN_HEADER,
                value: Some(&origin),
            });
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
        if let Some(key) = message.key() {
            record = record.key(key);
        }
        if let Some(payload) = message.payload() {
            record = record.payload(payload);
        }
        producer
            .send(record, self.timeout)
            .await
            .map(drop)
            .map_err(|(e, _)| format!("the dead letter of {origin} was not taken: {e}").into())
    }

    /// Pauses the message's partition, then after `delay` seeks it back to the message and
    /// resumes it.
    fn rewind(&self, message: &BorrowedMessage<'_>, delay: Duration) -> Result<(), BoxError> {
        let (topic, partition, offset) = (
            message.topic().to_owned(),
            message.partition(),
            message.offset(),
        );
        let mut list = TopicPartitionList::new();
        list.add_partition(&topic, partition);
        self.consumer.pause(&list)?;
        self.state()
            .rewinding
            .insert((topic.clone(), partition), offset);
        let (consumer, state, timeout) = (
            Arc::clone(&self.consumer),
            Arc::clone(&self.state),
            self.timeout,
        );
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            // Off the runtime's threads: librdkafka's seek waits for the broker.
            let _ = tokio::task::spawn_blocking(move || {
                // The seek drops what was fetched of the partition before it, so from here on
                // the partition's messages are the rewound ones: admit them, then resume.
                let seek = consumer.seek(&topic, partition, Offset::Offset(offset), timeout);
                state
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .rewinding
                    .remove(&(topic.clone(), partition));
                let resumed = consumer.resume(&list);
                if let Err(e) = seek.map_err(|e| e.to_string()).and(resumed.map_err(|e| e.to_string())) {
                    // The partition was revoked meanwhile: its next owner reads from the last
                    // committed offset, at or before this message.
                    tracing::warn!(%topic, partition, offset, error = %e, "could not rewind the partition to a requeued message");
                }
            })
            .await;
        });
        Ok(())
    }
}
