//! examples/mq_consumer.rs against the local RabbitMQ (`IDEM_AMQP_URL`): orders published twice
//! under distinct message ids, a consumer killed after its side effect but before its ack, a
//! failure nacked with requeue, and messages no retry can fix dead-lettered to `<queue>.dead`.
//! The `orders_shipped` table (not idem's counters) must end with one row per order number, and
//! the queue with nothing left to deliver.
#![cfg(feature = "rabbitmq")]

#[path = "../../examples/mq_consumer.rs"]
#[allow(dead_code)]
mod mq_consumer;
#[path = "contract/server.rs"]
mod server;

use std::future::Future;
use std::time::Duration;

#[path = "support/mq_audit.rs"]
#[allow(dead_code)]
mod mq_audit;

use idem::inbox::amqp;
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use mq_audit::shipping;
use mq_consumer::{Plan, Shipping, rabbit};

/// One test's queue (with its dead-letter queue), its messages already published, a connection,
/// and a fresh shipping database.
struct Fresh {
    url: String,
    queue: String,
    conn: lapin::Connection,
    shipping: Shipping,
    msgs: Vec<(String, Vec<u8>)>,
    _dir: tempfile::TempDir,
}

/// Runs `body` on a [`Fresh`] queue (declared here, `traffic(queue)` published to it) in a task of
/// its own, then deletes the queue and its dead-letter queue, also when `body` panicked (the panic
/// is then passed on). Skips when the broker is unreachable.
async fn on_fresh_queue<F, Fut>(prefix: &str, traffic: mq_audit::Traffic, body: F)
where
    F: FnOnce(Fresh) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let url = mq_consumer::amqp_url();
    let Some(conn) = mq_audit::broker("RabbitMQ", &url, rabbit::connect(&url)).await else {
        return;
    };
    let queue = server::unique(prefix);
    rabbit::declare(&conn, &queue)
        .await
        .expect("declare the test queue");
    let fresh_queue = queue.clone();
    let ran = tokio::spawn(async move {
        let conn = rabbit::connect(&url).await.expect("connect to RabbitMQ");
        let dir = tempfile::tempdir().unwrap();
        let shipping = shipping(&dir).await;
        let msgs = traffic(&fresh_queue);
        rabbit::publish(&conn, &fresh_queue, &msgs).await.unwrap();
        body(Fresh {
            url,
            queue: fresh_queue,
            conn,
            shipping,
            msgs,
            _dir: dir,
        })
        .await
    })
    .await;
    let deleted = rabbit::delete(&conn, &queue).await;
    if let Err(e) = ran {
        std::panic::resume_unwind(e.into_panic());
    }
    deleted.expect("delete the test queues");
}

/// The demo's six messages, ids `<queue>-m1` … `<queue>-m6`.
fn demo_traffic(queue: &str) -> Vec<(String, Vec<u8>)> {
    mq_consumer::demo_messages(&format!("{queue}-m"))
}

/// `(ready messages, consumers)` of `queue`, from a passive declare. Unacked deliveries of a closed
/// channel are back among the ready ones.
async fn queue_state(conn: &lapin::Connection, queue: &str) -> (u32, u32) {
    let channel = conn.create_channel().await.unwrap();
    let passive = QueueDeclareOptions::default().passive();
    let q = channel
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
        .expect("passive declare of the test queue");
    (q.message_count(), q.consumer_count())
}

/// Waits (up to 10 s) until no consumer is attached to `queue` any more, so the broker has
/// requeued whatever a closed consumer left unacked, then gives the ready count.
async fn ready_after_consumers_left(conn: &lapin::Connection, queue: &str) -> u32 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (ready, consumers) = queue_state(conn, queue).await;
        if consumers == 0 {
            return ready;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "queue {queue} still has {consumers} consumer(s) 10 s after the consumer closed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The message ids in `queue`, taken out of it (waits up to 5 s for `expect` of them), sorted.
async fn drain_ids(conn: &lapin::Connection, queue: &str, expect: usize) -> Vec<String> {
    let channel = conn.create_channel().await.unwrap();
    let mut ids = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let got = channel
            .basic_get(queue.into(), BasicGetOptions::default())
            .await
            .unwrap();
        match got {
            Some(got) => {
                let id = got.delivery.properties.message_id().as_ref();
                ids.push(id.map(|id| id.as_str().to_owned()).unwrap_or_default());
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
async fn a_consumer_killed_before_its_ack_ships_once_and_the_redelivery_is_acked() {
    on_fresh_queue("idem_mq_kill", demo_traffic, |fresh| async move {
        let Fresh {
            url,
            queue,
            conn,
            shipping,
            msgs,
            ..
        } = &fresh;

        // Consumer 1 ships ORD-2, commits, and dies before acking it.
        let plan = Plan::settle(msgs.len()).crash_after("ORD-2");
        let run1 = rabbit::run_consumer(url, queue, shipping, &plan)
            .await
            .unwrap();
        let crashed = mq_audit::died_after_shipping_ord2(&run1, shipping).await;
        assert!(
            ready_after_consumers_left(conn, queue).await >= 1,
            "the unacked ORD-2 delivery went back to the queue"
        );

        // Consumer 2 gets the unacked delivery again (same message id, redelivered) and acks it
        // as a replay; the order is not shipped twice.
        let rest = Plan::settle(msgs.len() - run1.settled());
        let run2 = rabbit::run_consumer(url, queue, shipping, &rest)
            .await
            .unwrap();
        mq_audit::redelivered_as_replay(&run2, crashed);
        // Every order number's second message (another message id) was a duplicate too.
        mq_audit::shipped_each_order_once(&[&run1, &run2], msgs.len(), shipping).await;
        assert_eq!(
            ready_after_consumers_left(conn, queue).await,
            0,
            "messages left in {queue}"
        );
        let dead = amqp::dead_letter_queue(queue);
        assert!(
            drain_ids(conn, &dead, 0).await.is_empty(),
            "nothing in {dead}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_is_nacked_with_requeue_and_the_redelivery_ships_once() {
    on_fresh_queue("idem_mq_nack", demo_traffic, |fresh| async move {
        let Fresh {
            url,
            queue,
            conn,
            shipping,
            msgs,
            ..
        } = &fresh;
        // The warehouse fails on the first try for ORD-3, after its row was written.
        shipping.fail_once("ORD-3");

        let run = rabbit::run_consumer(url, queue, shipping, &Plan::settle(msgs.len()))
            .await
            .unwrap();

        mq_audit::failed_then_shipped_once(&run);
        // The failed try's row was rolled back with its claim.
        mq_audit::shipped_each_order_once(&[&run], msgs.len(), shipping).await;
        assert_eq!(
            ready_after_consumers_left(conn, queue).await,
            0,
            "messages left in {queue}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_payload_a_blank_order_number_or_another_payload_under_a_shipped_order_is_dead_lettered()
 {
    on_fresh_queue(
        "idem_mq_dead",
        mq_audit::refused_messages,
        |fresh| async move {
            let Fresh {
                url,
                queue,
                conn,
                shipping,
                msgs,
                ..
            } = &fresh;
            let run = rabbit::run_consumer(url, queue, shipping, &Plan::settle(msgs.len()))
                .await
                .unwrap();
            mq_audit::refused_were_dead_lettered(&run, queue, shipping).await;
            // Rejected without requeue, they are in the dead-letter queue, not redelivered.
            let dead: Vec<String> = ["blank", "garbage", "other"]
                .iter()
                .map(|name| format!("{queue}-{name}"))
                .collect();
            assert_eq!(
                drain_ids(conn, &amqp::dead_letter_queue(queue), 3).await,
                dead,
                "the dead-letter queue holds exactly the three refused messages"
            );
            assert_eq!(
                ready_after_consumers_left(conn, queue).await,
                0,
                "messages left in {queue}"
            );
        },
    )
    .await;
}
