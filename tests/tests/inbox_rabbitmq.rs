//! `idem::inbox` on the local RabbitMQ (`IDEM_AMQP_URL`): verdicts, attempts counted per key and
//! dead letters, settled by `idem::inbox::amqp` on a quorum queue with its dead-letter queue. The
//! audit is the shipping service's own SQLite table and what the dead-letter queue holds.

#[path = "support/inbox_orders.rs"]
mod inbox_orders;
#[path = "contract/server.rs"]
mod server;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use idem::inbox::{Inbox, Verdict, amqp};
use inbox_orders::{Orders, Seen};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

fn url() -> String {
    server::amqp_url()
}

/// A channel on a fresh quorum queue (and its dead-letter queue), deleted after `body`, also when
/// it panicked. Skips when the broker is unreachable.
async fn on_fresh_queue<F, Fut>(prefix: &str, body: F)
where
    F: FnOnce(Channel, String) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let url = url();
    let connect = Connection::connect(&url, ConnectionProperties::default());
    let Some(conn) = server::reach("RabbitMQ", &url, connect).await else {
        return;
    };
    let queue = server::unique(prefix);
    let channel = conn.create_channel().await.unwrap();
    amqp::declare_queue(&channel, &queue).await.unwrap();
    let ran = tokio::spawn(body(channel.clone(), queue.clone())).await;
    for q in [queue.clone(), amqp::dead_letter_queue(&queue)] {
        let _ = channel
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let _ = conn.close(200, "done".into()).await;
    if let Err(e) = ran {
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn publish(channel: &Channel, queue: &str, msgs: &[(String, Vec<u8>)]) {
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for (id, payload) in msgs {
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                payload,
                BasicProperties::default().with_message_id(id.as_str().into()),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack(), "RabbitMQ confirmed {id}");
    }
}

/// A consumer of `queue` with a prefetch of `prefetch`, and its tag.
async fn start_consumer(
    channel: &Channel,
    queue: &str,
    prefetch: u16,
) -> (String, lapin::Consumer) {
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await
        .unwrap();
    let tag = server::unique("idem-inbox");
    let deliveries = channel
        .basic_consume(
            queue.into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    (tag, deliveries)
}

/// A delivery's message id (empty when it has none).
fn message_id(delivery: &lapin::message::Delivery) -> String {
    delivery
        .properties
        .message_id()
        .as_ref()
        .map(|id| id.as_str().to_owned())
        .unwrap_or_default()
}

/// Consumes `queue` until `terminal` deliveries were acked or dead-lettered (bounded by 30 s),
/// each through the inbox and settled by `amqp::settle`.
async fn consume(
    channel: &Channel,
    queue: &str,
    orders: &Arc<Orders>,
    inbox: &Inbox,
    terminal: usize,
) -> Seen {
    let (tag, mut deliveries) = start_consumer(channel, queue, 4).await;
    let mut seen = Seen::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut done = 0;
    while done < terminal {
        let delivery = tokio::time::timeout_at(deadline, deliveries.next())
            .await
            .unwrap_or_else(|_| panic!("{done} of {terminal} settled after 30 s: {seen:#?}"))
            .expect("the consumer was cancelled")
            .unwrap();
        let id = message_id(&delivery);
        let handled = orders
            .handle(inbox, &delivery.data, amqp::delivered(&delivery))
            .await;
        if !matches!(handled.verdict, Verdict::Requeue { .. }) {
            done += 1;
        }
        amqp::settle(&delivery, &handled.verdict).await.unwrap();
        seen.0.push((id, handled.outcome, handled.verdict));
    }
    channel
        .basic_cancel(tag.as_str().into(), Default::default())
        .await
        .unwrap();
    seen
}

/// The message ids in `queue`, taken out of it (bounded: waits up to 5 s for `expect` of them).
async fn drain_ids(channel: &Channel, queue: &str, expect: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match channel
            .basic_get(queue.into(), BasicGetOptions::default())
            .await
            .unwrap()
        {
            Some(got) => {
                ids.push(message_id(&got.delivery));
                got.delivery.ack(BasicAckOptions::default()).await.unwrap();
            }
            None if ids.len() >= expect || tokio::time::Instant::now() > deadline => break,
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_ack_failures_retry_then_dead_letter_and_poison_dead_letters_at_once() {
    on_fresh_queue("idem_inbox_mix", |channel, queue| async move {
        let orders = Orders::new().await;
        inbox_orders::plant(&orders, &queue);
        let msgs = inbox_orders::traffic(&queue);
        publish(&channel, &queue, &msgs).await;
        // Every message ends acked or dead-lettered: 10 terminal verdicts.
        let seen = consume(
            &channel,
            &queue,
            &orders,
            &inbox_orders::inbox(),
            msgs.len(),
        )
        .await;
        inbox_orders::assert_settled(&orders, &queue, &seen).await;
        // The quorum queue counted BAD's deliveries as idem counted its attempts.
        assert_eq!(
            drain_ids(&channel, &amqp::dead_letter_queue(&queue), 2).await,
            [format!("{queue}-BAD-m1"), format!("{queue}-POISON-m1")],
            "the dead-letter queue holds exactly the poison and the order out of attempts"
        );
        assert!(
            drain_ids(&channel, &queue, 0).await.is_empty(),
            "nothing left in the work queue"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_while_its_key_is_in_progress_is_requeued_then_acked_as_a_replay() {
    on_fresh_queue("idem_inbox_busy", |channel, queue| async move {
        let orders = Orders::new().await;
        let order_no = format!("{queue}-SLOW");
        let (payload, releaser) = inbox_orders::held_in_progress(&orders, &order_no).await;
        publish(&channel, &queue, &[(format!("{order_no}-m2"), payload)]).await;
        let seen = consume(&channel, &queue, &orders, &inbox_orders::inbox(), 1).await;
        releaser.await.unwrap();
        inbox_orders::assert_requeued_while_busy_then_replayed(&orders, &order_no, &seen).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_idem_record_the_quorum_queues_delivery_count_limits_the_attempts() {
    on_fresh_queue("idem_inbox_count", |channel, queue| async move {
        publish(&channel, &queue, &[(format!("{queue}-m1"), b"{}".to_vec())]).await;
        let inbox = inbox_orders::inbox();
        let mut deliveries = channel
            .basic_consume(
                queue.as_str().into(),
                "idem-inbox-count".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let mut counts = Vec::new();
        loop {
            let delivery = tokio::time::timeout(Duration::from_secs(10), deliveries.next())
                .await
                .expect("a delivery within 10 s")
                .unwrap()
                .unwrap();
            // A handler that fails before it reaches any idempotent call (as a transaction-mode
            // handler whose body failed: its claim rolled back with it).
            let handled = inbox
                .handle(amqp::delivered(&delivery), async {
                    Err::<(), _>("the database is down")
                })
                .await;
            counts.push(handled.attempts);
            amqp::settle(&delivery, &handled.verdict).await.unwrap();
            if let Verdict::DeadLetter { reason } = handled.verdict {
                assert_eq!(reason, "failed 3 times: the database is down");
                break;
            }
        }
        assert_eq!(
            counts,
            [1, 2, 3],
            "x-delivery-count numbered the deliveries"
        );
        assert_eq!(
            drain_ids(&channel, &amqp::dead_letter_queue(&queue), 1).await,
            [format!("{queue}-m1")]
        );
    })
    .await;
}

/// Consumes `queue` with a prefetch of `size`, handling what the prefetch holds as one batch
/// (`Inbox::handle_batch`: one batch claim), until `terminal` deliveries were acked or
/// dead-lettered (bounded by 30 s); each delivery settled by `amqp::settle`.
async fn consume_batches(
    channel: &Channel,
    queue: &str,
    orders: &Arc<Orders>,
    inbox: &Inbox,
    terminal: usize,
    size: u16,
) -> (Seen, usize) {
    let (tag, mut deliveries) = start_consumer(channel, queue, size).await;
    let mut seen = Seen::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (mut done, mut batches) = (0, 0);
    while done < terminal {
        let first = tokio::time::timeout_at(deadline, deliveries.next())
            .await
            .unwrap_or_else(|_| panic!("{done} of {terminal} settled after 30 s: {seen:#?}"))
            .expect("the consumer was cancelled")
            .unwrap();
        // What the prefetch holds now, up to `size`.
        let mut batch = vec![first];
        while batch.len() < usize::from(size) {
            match tokio::time::timeout(Duration::from_millis(20), deliveries.next()).await {
                Ok(Some(delivery)) => batch.push(delivery.unwrap()),
                _ => break,
            }
        }
        batches += 1;
        let handed: Vec<(&[u8], Option<u32>)> = batch
            .iter()
            .map(|d| (&d.data[..], amqp::delivered(d)))
            .collect();
        let handled = orders.handle_batch(inbox, &handed).await;
        for (delivery, handled) in batch.iter().zip(handled) {
            let id = message_id(delivery);
            if !matches!(handled.verdict, Verdict::Requeue { .. }) {
                done += 1;
            }
            amqp::settle(delivery, &handled.verdict).await.unwrap();
            seen.0.push((id, handled.outcome, handled.verdict));
        }
    }
    channel
        .basic_cancel(tag.as_str().into(), Default::default())
        .await
        .unwrap();
    (seen, batches)
}

/// The same traffic with a prefetch of 8, each prefetch's deliveries handled with one batch
/// claim: every verdict holds as with one delivery at a time, each good order shipped once, the
/// dead letters exactly the poison and the order out of attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetched_batches_are_claimed_at_once_and_every_verdict_holds() {
    on_fresh_queue("idem_inbox_batch", |channel, queue| async move {
        let orders = Orders::new().await;
        inbox_orders::plant(&orders, &queue);
        let msgs = inbox_orders::traffic(&queue);
        publish(&channel, &queue, &msgs).await;
        let (seen, batches) = consume_batches(
            &channel,
            &queue,
            &orders,
            &inbox_orders::inbox(),
            msgs.len(),
            8,
        )
        .await;
        assert!(
            batches < msgs.len(),
            "{batches} batches for {} messages",
            msgs.len()
        );
        inbox_orders::assert_settled(&orders, &queue, &seen).await;
        assert_eq!(
            drain_ids(&channel, &amqp::dead_letter_queue(&queue), 2).await,
            [format!("{queue}-BAD-m1"), format!("{queue}-POISON-m1")],
            "the dead-letter queue holds exactly the poison and the order out of attempts"
        );
        assert!(
            drain_ids(&channel, &queue, 0).await.is_empty(),
            "nothing left in the work queue"
        );
    })
    .await;
}
