//! examples/mq_consumer.rs against the local RabbitMQ (`IDEM_AMQP_URL`): orders published twice
//! under distinct message ids, a consumer killed after its side effect but before its ack, and a
//! failure nacked with requeue. The `orders_shipped` table (not idem's counters) must end with one
//! row per order number, and the queue with nothing left to deliver.

#[path = "../examples/mq_consumer.rs"]
#[allow(dead_code)]
mod mq_consumer;
#[path = "contract/server.rs"]
#[allow(dead_code)]
mod server;

use std::future::Future;
use std::time::Duration;

#[path = "support/mq_audit.rs"]
mod mq_audit;

use idem::Outcome;
use mq_audit::{one_row_per_order, shipping};
use mq_consumer::{Plan, Shipping, Verdict};

/// One test's queue, its six demo messages already published, a connection, and a fresh
/// shipping database.
struct Fresh {
    url: String,
    queue: String,
    conn: lapin::Connection,
    shipping: Shipping,
    msgs: Vec<(String, mq_consumer::OrderMsg)>,
    _dir: tempfile::TempDir,
}

/// Runs `body` on a [`Fresh`] queue (declared here) in a task of its own, then deletes the queue,
/// also when `body` panicked (the panic is then passed on). Skips when the broker is unreachable.
async fn on_fresh_queue<F, Fut>(prefix: &str, body: F)
where
    F: FnOnce(Fresh) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let url = mq_consumer::amqp_url();
    let Some(conn) = mq_audit::broker("RabbitMQ", &url, mq_consumer::rabbit_connect(&url)).await
    else {
        return;
    };
    let queue = server::unique(prefix);
    mq_consumer::rabbit_declare(&conn, &queue)
        .await
        .expect("declare the test queue");
    let fresh_queue = queue.clone();
    let ran = tokio::spawn(async move {
        let conn = mq_consumer::rabbit_connect(&url)
            .await
            .expect("connect to RabbitMQ");
        let dir = tempfile::tempdir().unwrap();
        let shipping = shipping(&dir).await;
        let msgs = mq_consumer::demo_messages(&format!("{fresh_queue}-m"));
        mq_consumer::rabbit_publish(&conn, &fresh_queue, &msgs)
            .await
            .unwrap();
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
    let deleted = mq_consumer::rabbit_delete(&conn, &queue).await;
    if let Err(e) = ran {
        std::panic::resume_unwind(e.into_panic());
    }
    deleted.expect("delete the test queue");
}

/// Waits (up to 10 s) until no consumer is attached to `queue` any more, so the broker has
/// requeued whatever a closed consumer left unacked, then gives the ready count.
async fn ready_after_consumers_left(conn: &lapin::Connection, queue: &str) -> u32 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (ready, consumers) = mq_consumer::rabbit_queue_state(conn, queue)
            .await
            .expect("passive declare of the test queue");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_before_its_ack_ships_once_and_the_redelivery_is_acked() {
    on_fresh_queue("idem_mq_kill", |fresh| async move {
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
        let run1 = mq_consumer::run_rabbit_consumer(url, queue, shipping, &plan)
            .await
            .unwrap();
        let crashed = mq_audit::died_after_shipping_ord2(&run1, shipping).await;
        assert!(
            ready_after_consumers_left(conn, queue).await >= 1,
            "the unacked ORD-2 delivery went back to the queue"
        );

        // Consumer 2 gets the unacked delivery again (same message id, redelivered) and acks it
        // as a duplicate; the order is not shipped twice.
        let rest = Plan::settle(msgs.len() - run1.settled());
        let run2 = mq_consumer::run_rabbit_consumer(url, queue, shipping, &rest)
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
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_is_nacked_with_requeue_and_the_redelivery_ships_once() {
    on_fresh_queue("idem_mq_nack", |fresh| async move {
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

        let run = mq_consumer::run_rabbit_consumer(url, queue, shipping, &Plan::settle(msgs.len()))
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

/// No broker needed: what the handler answers for payloads that must not be redelivered forever.
#[tokio::test]
async fn an_unreadable_payload_a_blank_order_number_or_another_payload_under_a_shipped_order_is_rejected()
 {
    let dir = tempfile::tempdir().unwrap();
    let shipping = shipping(&dir).await;
    let garbage = shipping.handle(b"{not json").await;
    assert_eq!(garbage.verdict, Verdict::Reject, "{garbage:?}");
    assert_eq!(garbage.outcome, None);

    let no_number = mq_consumer::OrderMsg {
        order_no: " ".into(),
        sku: "SKU-9".into(),
        qty: 1,
    };
    let no_number = shipping
        .handle(&serde_json::to_vec(&no_number).unwrap())
        .await;
    assert_eq!(
        (no_number.verdict, no_number.outcome),
        (Verdict::Reject, Some(Outcome::Rejected)),
        "{no_number:?}"
    );

    let order = mq_consumer::OrderMsg {
        order_no: "ORD-9".into(),
        sku: "SKU-9".into(),
        qty: 1,
    };
    let first = shipping.handle(&serde_json::to_vec(&order).unwrap()).await;
    assert_eq!(
        (first.verdict, first.outcome),
        (Verdict::Ack, Some(Outcome::Executed)),
        "{first:?}"
    );
    let tampered = mq_consumer::OrderMsg { qty: 99, ..order };
    let other = shipping
        .handle(&serde_json::to_vec(&tampered).unwrap())
        .await;
    assert_eq!(
        (other.verdict, other.outcome),
        (Verdict::Reject, Some(Outcome::Mismatch)),
        "{other:?}"
    );
    assert_eq!(
        shipping.shipped().await.unwrap(),
        one_row_per_order(&["ORD-9"])
    );
}
