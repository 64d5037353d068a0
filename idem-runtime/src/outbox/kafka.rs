//! Outbox messages to Kafka (`rdkafka`, feature `kafka`).

use std::time::Duration;

use async_trait::async_trait;
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::{OutboxMessage, Publisher};
use crate::BoxError;

/// The header that carries the row's [`message_id`](OutboxMessage::message_id).
pub const ID_HEADER: &str = "idem-message-id";

/// Publishes each message to the topic its destination names, with the row's key as the record's
/// key (so every message about one key goes to one partition, in order) and the row's
/// [`message_id`](OutboxMessage::message_id) in [`ID_HEADER`], and returns once the broker
/// acknowledged it (the delivery report). A topic that does not exist (with topic creation off)
/// or a broker that does not answer within the producer's `message.timeout.ms` is an error, and
/// the row is retried.
///
/// [`KafkaPublisher::connect`] sets the producer up as the relay needs it: `enable.idempotence`
/// (the broker drops a retry of a batch it already wrote, so the producer's own retries never
/// duplicate or reorder; it implies `acks=all`).
#[derive(Clone)]
pub struct KafkaPublisher {
    producer: FutureProducer,
    timeout: Duration,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher").finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// A publisher on a producer of its own for `bootstrap_servers` (`host:port[,host:port…]`),
    /// idempotent, with a delivery timeout of 30 s.
    ///
    /// # Errors
    /// librdkafka's refusal of the configuration.
    pub fn connect(bootstrap_servers: &str) -> Result<Self, BoxError> {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap_servers)
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", "30000")
            .create()?;
        Ok(KafkaPublisher::new(producer))
    }

    /// A publisher on `producer` as it is configured (set `enable.idempotence=true` on it for the
    /// guarantees above).
    pub fn new(producer: FutureProducer) -> Self {
        KafkaPublisher {
            producer,
            timeout: Duration::from_secs(30),
        }
    }
}

#[async_trait]
impl Publisher for KafkaPublisher {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), BoxError> {
        let headers = OwnedHeaders::new().insert(Header {
            key: ID_HEADER,
            value: Some(message.message_id()),
        });
        let record = FutureRecord::to(&message.destination)
            .key(&message.key)
            .payload(&message.payload)
            .headers(headers);
        self.producer
            .send(record, self.timeout)
            .await
            .map(drop)
            .map_err(|(e, _)| {
                format!(
                    "Kafka did not take message {} for topic `{}`: {e}",
                    message.message_id(),
                    message.destination
                )
                .into()
            })
    }
}
