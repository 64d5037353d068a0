//! Outbox messages to NATS JetStream (`async-nats`, feature `nats`).

use async_nats::jetstream::Context;
use async_nats::jetstream::message::PublishMessage;
use async_trait::async_trait;

use super::{OutboxMessage, Publisher};
use crate::BoxError;

/// The header that carries the message's key.
pub const KEY_HEADER: &str = "Idem-Key";

/// Publishes each message on the subject its destination names, with `Nats-Msg-Id` = the row's
/// [`message_id`](OutboxMessage::message_id) (so the stream's duplicate window drops a relay's
/// re-send) and the key in [`KEY_HEADER`], and returns once the stream acked it. A subject no
/// stream captures is an error, and the row is retried.
#[derive(Debug, Clone)]
pub struct JetStreamPublisher {
    context: Context,
}

impl JetStreamPublisher {
    /// A publisher on `context`.
    pub fn new(context: Context) -> Self {
        JetStreamPublisher { context }
    }
}

#[async_trait]
impl Publisher for JetStreamPublisher {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), BoxError> {
        let publish = PublishMessage::build()
            .message_id(message.message_id())
            .header(KEY_HEADER, message.key.as_str())
            .payload(message.payload.clone().into());
        self.context
            .send_publish(message.destination.clone(), publish)
            .await?
            .await?;
        Ok(())
    }
}
