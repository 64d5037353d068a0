//! The inbox on NATS JetStream (`async-nats`, feature `nats`): the delivery count, and a
//! [`Verdict`] settled as JetStream wants it, with dead letters copied to a subject of their own.
//!
//! The loop below shows the calls; the messaging guide (`docs/guide/messaging.md` in the
//! repository, `idem::_guide::messaging` in the `idemkit` docs) has a whole consumer with a real
//! handler, the queue or stream it reads, and the crates it needs.
//!
//! ```no_run
//! # use idem_runtime as idem;
//! # async fn demo(consumer: async_nats::jetstream::consumer::PullConsumer, inbox: idem_runtime::inbox::Inbox) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use futures_util::StreamExt;
//! use idem::inbox::jetstream;
//! let mut messages = consumer.messages().await?;
//! while let Some(message) = messages.next().await {
//!     let message = message?;
//!     let handled = inbox
//!         .handle_json(&message.payload, jetstream::delivered(&message), |order: serde_json::Value| async move {
//!             Ok::<_, idem::IdemError>(order) // an #[idempotent] fn keyed by the order number
//!         })
//!         .await;
//!     jetstream::settle(&message, &handled.verdict, Some("orders.dead")).await?;
//! }
//! # Ok(()) }
//! ```

use async_nats::jetstream::AckKind;
use async_nats::jetstream::message::{Message, PublishMessage};

use super::Verdict;
use crate::BoxError;

/// The header a dead letter carries its reason in.
pub const REASON_HEADER: &str = "Idem-Dead-Letter-Reason";

/// This delivery's number, 1 for the first (JetStream's `num_delivered`); `None` for a message
/// without JetStream metadata.
pub fn delivered(message: &Message) -> Option<u32> {
    let info = message.info().ok()?;
    u32::try_from(info.delivered).ok()
}

/// Tells JetStream the verdict, waiting for the server to confirm it: [`Verdict::Ack`] acks;
/// [`Verdict::Requeue`] naks with the delay (JetStream redelivers after it);
/// [`Verdict::DeadLetter`] publishes a copy to `dead_letters` (the payload, its headers, the
/// reason in [`REASON_HEADER`], and `Nats-Msg-Id` = `dead:<stream>:<sequence>`, so a copy sent
/// again after a crash is dropped by a stream's duplicate window), waits for the stream's ack,
/// then terminates the message. With `dead_letters = None` the message is terminated only (the
/// log line has the reason). A subject no stream captures fails the publish, and the message is
/// not terminated.
///
/// # Errors
/// The server's or the connection's error; the message then comes back after its `ack_wait`.
pub async fn settle(
    message: &Message,
    verdict: &Verdict,
    dead_letters: Option<&str>,
) -> Result<(), BoxError> {
    match verdict {
        Verdict::Ack => message.double_ack().await?,
        Verdict::Requeue { delay } => message.double_ack_with(AckKind::Nak(Some(*delay))).await?,
        Verdict::DeadLetter { reason } => {
            if let Some(subject) = dead_letters {
                let mut headers = message.headers.clone().unwrap_or_default();
                headers.insert(REASON_HEADER, one_line(reason).as_str());
                let id = match message.info() {
                    Ok(info) => format!("dead:{}:{}", info.stream, info.stream_sequence),
                    Err(_) => String::new(),
                };
                let mut copy = PublishMessage::build()
                    .payload(message.payload.clone())
                    .headers(headers);
                if !id.is_empty() {
                    copy = copy.message_id(id);
                }
                message
                    .context
                    .send_publish(subject.to_owned(), copy)
                    .await?
                    .await?;
            }
            message.double_ack_with(AckKind::Term).await?;
        }
    }
    Ok(())
}

/// `text` without line breaks (a header value is one line).
fn one_line(text: &str) -> String {
    text.replace(['\r', '\n'], " ")
}
