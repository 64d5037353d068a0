//! The inbox on RabbitMQ (`lapin`, feature `rabbitmq`): a queue with a dead-letter queue, the
//! delivery count, and a [`Verdict`] settled as AMQP wants it.
//!
//! The loop below shows the calls; the messaging guide (`docs/guide/messaging.md` in the
//! repository, `idem::_guide::messaging` in the `idemkit` docs) has a whole consumer with a real
//! handler, the queue or stream it reads, and the crates it needs.
//!
//! ```no_run
//! # use idem_runtime as idem;
//! # async fn demo(channel: lapin::Channel, inbox: idem_runtime::inbox::Inbox) -> Result<(), Box<dyn std::error::Error>> {
//! use futures_util::StreamExt;
//! use idem::inbox::amqp;
//! amqp::declare_queue(&channel, "orders").await?; // and "orders.dead"
//! let mut deliveries = channel
//!     .basic_consume("orders".into(), "shipping".into(), Default::default(), Default::default())
//!     .await?;
//! while let Some(delivery) = deliveries.next().await {
//!     let delivery = delivery?;
//!     let handled = inbox
//!         .handle_json(&delivery.data, amqp::delivered(&delivery), |order: serde_json::Value| async move {
//!             Ok::<_, idem::IdemError>(order) // an #[idempotent] fn keyed by the order number
//!         })
//!         .await;
//!     amqp::settle(&delivery, &handled.verdict).await?;
//! }
//! # Ok(()) }
//! ```

use lapin::Channel;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};

use super::Verdict;

/// The name of `queue`'s dead-letter queue: `<queue>.dead`.
pub fn dead_letter_queue(queue: &str) -> String {
    format!("{queue}.dead")
}

/// Declares `queue` as a durable quorum queue whose rejected messages go to
/// [`dead_letter_queue`]`(queue)` (declared too, also quorum), through the default exchange.
/// Quorum queues count deliveries (`x-delivery-count`), which [`delivered`] reads, so attempts are
/// counted also where no idem record keeps them (transaction mode). Declaring an existing queue
/// with other arguments fails (`PRECONDITION_FAILED`): declare such a queue yourself, with
/// `x-dead-letter-exchange` = `""` and `x-dead-letter-routing-key` = its dead-letter queue.
///
/// # Errors
/// The broker's refusal.
pub async fn declare_queue(channel: &Channel, queue: &str) -> lapin::Result<()> {
    let dead = dead_letter_queue(queue);
    let quorum = || {
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        args
    };
    channel
        .queue_declare(
            dead.as_str().into(),
            QueueDeclareOptions::durable(),
            quorum(),
        )
        .await?;
    let mut args = quorum();
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    args.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(dead.as_str().into()),
    );
    channel
        .queue_declare(queue.into(), QueueDeclareOptions::durable(), args)
        .await?;
    Ok(())
}

/// This delivery's number, 1 for the first: from the quorum queue's `x-delivery-count` header
/// (the deliveries before this one); 1 for a delivery not marked redelivered; `None` for a
/// redelivery from a queue that does not count (a classic queue).
pub fn delivered(delivery: &Delivery) -> Option<u32> {
    let count = delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get("x-delivery-count"))
        .and_then(|value| match value {
            AMQPValue::LongLongInt(n) => u32::try_from(*n).ok(),
            AMQPValue::LongInt(n) => u32::try_from(*n).ok(),
            AMQPValue::LongUInt(n) => Some(*n),
            AMQPValue::ShortInt(n) => u32::try_from(*n).ok(),
            AMQPValue::ShortUInt(n) => Some(u32::from(*n)),
            AMQPValue::ShortShortInt(n) => u32::try_from(*n).ok(),
            AMQPValue::ShortShortUInt(n) => Some(u32::from(*n)),
            _ => None,
        });
    match count {
        Some(before) => Some(before.saturating_add(1)),
        None if !delivery.redelivered => Some(1),
        None => None,
    }
}

/// Tells RabbitMQ the verdict: [`Verdict::Ack`] acks; [`Verdict::Requeue`] waits out its delay,
/// then nacks with requeue (AMQP has no delayed requeue: the delivery keeps its prefetch slot
/// meanwhile, so set the channel's prefetch above 1 or handle deliveries concurrently);
/// [`Verdict::DeadLetter`] rejects without requeue, and the queue's dead-letter exchange moves the
/// message to its dead-letter queue (with RabbitMQ's `x-death` header saying so; the reason is in
/// the inbox's log line).
///
/// # Errors
/// The channel's error; the message then comes back (unacked) when the channel closes.
pub async fn settle(delivery: &Delivery, verdict: &Verdict) -> lapin::Result<()> {
    match verdict {
        Verdict::Ack => delivery.ack(BasicAckOptions::default()).await?,
        Verdict::Requeue { delay } => {
            if !delay.is_zero() {
                tokio::time::sleep(*delay).await;
            }
            delivery
                .nack(BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                })
                .await?
        }
        Verdict::DeadLetter { .. } => {
            delivery
                .reject(BasicRejectOptions { requeue: false })
                .await?
        }
    };
    Ok(())
}
