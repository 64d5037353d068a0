//! Outbox messages to RabbitMQ (`lapin`, feature `rabbitmq`).

use async_trait::async_trait;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};

use lapin::{BasicProperties, Channel, Confirmation};

use super::{OutboxMessage, Publisher};
use crate::BoxError;

/// Publishes each message to the queue its destination names (through the default exchange),
/// persistent, with the row's [`message_id`](OutboxMessage::message_id) and the key as the
/// `correlation_id`, and `mandatory`: the publish succeeds only once the broker confirms it and
/// routed it to a queue (a destination with no queue is an error, and the row is retried).
#[derive(Debug, Clone)]
pub struct AmqpPublisher {
    channel: Channel,
}

impl AmqpPublisher {
    /// A publisher on `channel`, which it puts in confirm mode.
    ///
    /// # Errors
    /// The broker's refusal.
    pub async fn new(channel: Channel) -> lapin::Result<Self> {
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(AmqpPublisher { channel })
    }
}

#[async_trait]
impl Publisher for AmqpPublisher {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), BoxError> {
        let confirm = self
            .channel
            .basic_publish(
                "".into(),
                message.destination.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &message.payload,
                BasicProperties::default()
                    .with_message_id(message.message_id().into())
                    .with_correlation_id(message.key.as_str().into())
                    .with_delivery_mode(2),
            )
            .await?
            .await?;
        match confirm {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) => Err(format!(
                "RabbitMQ routed message {} to no queue (is `{}` declared?)",
                message.message_id(),
                message.destination
            )
            .into()),
            Confirmation::Nack(_) => {
                Err(format!("RabbitMQ refused message {}", message.message_id()).into())
            }
            Confirmation::NotRequested => Err("the channel is not in confirm mode".into()),
        }
    }
}
