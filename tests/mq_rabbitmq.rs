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

use idem::Outcome;
use mq_consumer::{Plan, Shipping, Tally, Verdict};

/// A connection to the broker, or `None` after the one skip line (a panic under
/// `IDEM_REQUIRE_SERVICES=1`).
async fn broker(url: &str) -> Option<lapin::Connection> {
    server::reach("RabbitMQ", url, async {
        tokio::time::timeout(Duration::from_secs(10), mq_consumer::rabbit_connect(url))
            .await
            .map_err(|_| "no answer within 10 s".to_owned())?
            .map_err(|e| e.to_string())
    })
    .await
}

/// Runs `body(url, queue)` on a queue of its own (declared here) in a task of its own, then deletes
/// the queue, also when `body` panicked (the panic is then passed on). Skips when the broker is
/// unreachable.
async fn on_fresh_queue<F, Fut>(prefix: &str, body: F)
where
    F: FnOnce(String, String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let url = mq_consumer::amqp_url();
    let Some(conn) = broker(&url).await else {
        return;
    };
    let queue = server::unique(prefix);
    mq_consumer::rabbit_declare(&conn, &queue)
        .await
        .expect("declare the test queue");
    let ran = tokio::spawn(body(url, queue.clone())).await;
    let deleted = mq_consumer::rabbit_delete(&conn, &queue).await;
    if let Err(e) = ran {
        std::panic::resume_unwind(e.into_panic());
    }
    deleted.expect("delete the test queue");
}

/// A fresh SQLite file for one test (removed with the directory).
async fn shipping(dir: &tempfile::TempDir) -> Shipping {
    Shipping::open(dir.path().join("shipping.db"))
        .await
        .expect("SQLite store opens")
}

fn one_row_per_order(orders: &[&str]) -> Vec<(String, i64)> {
    let mut want: Vec<(String, i64)> = orders.iter().map(|o| ((*o).to_owned(), 1)).collect();
    want.sort();
    want
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

fn deliveries_of<'a>(tally: &'a Tally, order_no: &str) -> Vec<&'a mq_consumer::Seen> {
    tally
        .seen
        .iter()
        .filter(|s| s.handled.order_no.as_deref() == Some(order_no))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_before_its_ack_ships_once_and_the_redelivery_is_acked() {
    on_fresh_queue("idem_mq_kill", |url, queue| async move {
        let conn = mq_consumer::rabbit_connect(&url)
            .await
            .expect("connect to RabbitMQ");
        let dir = tempfile::tempdir().unwrap();
        let shipping = shipping(&dir).await;
        let msgs = mq_consumer::demo_messages(&format!("{queue}-m"));
        mq_consumer::rabbit_publish(&conn, &queue, &msgs)
            .await
            .unwrap();

        // Consumer 1 ships ORD-2, commits, and dies before acking it.
        let plan = Plan::settle(msgs.len()).crash_after("ORD-2");
        let run1 = mq_consumer::run_rabbit_consumer(&url, &queue, &shipping, &plan)
            .await
            .unwrap();
        assert!(run1.crashed, "consumer 1 never reached ORD-2: {run1:#?}");
        let crashed = run1.seen.last().unwrap();
        assert_eq!(crashed.handled.order_no.as_deref(), Some("ORD-2"));
        assert!(
            shipping
                .shipped()
                .await
                .unwrap()
                .contains(&("ORD-2".to_owned(), 1)),
            "the killed consumer's side effect was committed"
        );
        assert!(
            ready_after_consumers_left(&conn, &queue).await >= 1,
            "the unacked ORD-2 delivery went back to the queue"
        );

        // Consumer 2 gets the unacked delivery again (same message id, redelivered) and acks it
        // as a duplicate; the order is not shipped twice.
        let rest = Plan::settle(msgs.len() - run1.settled());
        let run2 = mq_consumer::run_rabbit_consumer(&url, &queue, &shipping, &rest)
            .await
            .unwrap();
        let again = run2
            .seen
            .iter()
            .find(|s| s.message_id == crashed.message_id)
            .unwrap_or_else(|| panic!("{} was not redelivered: {run2:#?}", crashed.message_id));
        assert!(again.redelivered, "{again:?}");
        assert_eq!(again.handled.outcome, Some(Outcome::Replayed), "{again:?}");
        assert_eq!(again.handled.verdict, Verdict::Ack, "{again:?}");

        // Every order number's second message (another message id) was a duplicate too.
        let all: Vec<_> = run1.seen.iter().chain(&run2.seen).collect();
        for order in ["ORD-1", "ORD-2", "ORD-3"] {
            let executed = all
                .iter()
                .filter(|s| {
                    s.handled.order_no.as_deref() == Some(order)
                        && s.handled.outcome == Some(Outcome::Executed)
                })
                .count();
            assert_eq!(executed, 1, "{order} executed {executed} times: {all:#?}");
        }
        assert_eq!(
            run1.acked + run2.acked,
            msgs.len(),
            "every message acked once"
        );
        assert_eq!(
            shipping.shipped().await.unwrap(),
            one_row_per_order(&["ORD-1", "ORD-2", "ORD-3"])
        );
        assert_eq!(
            ready_after_consumers_left(&conn, &queue).await,
            0,
            "messages left in {queue}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_is_nacked_with_requeue_and_the_redelivery_ships_once() {
    on_fresh_queue("idem_mq_nack", |url, queue| async move {
        let conn = mq_consumer::rabbit_connect(&url)
            .await
            .expect("connect to RabbitMQ");
        let dir = tempfile::tempdir().unwrap();
        let shipping = shipping(&dir).await;
        let msgs = mq_consumer::demo_messages(&format!("{queue}-m"));
        mq_consumer::rabbit_publish(&conn, &queue, &msgs)
            .await
            .unwrap();
        // The warehouse fails on the first try for ORD-3, after its row was written.
        shipping.fail_once("ORD-3");

        let run =
            mq_consumer::run_rabbit_consumer(&url, &queue, &shipping, &Plan::settle(msgs.len()))
                .await
                .unwrap();

        let ord3 = deliveries_of(&run, "ORD-3");
        let first = ord3.first().expect("ORD-3 delivered");
        assert_eq!(first.handled.outcome, Some(Outcome::Failed), "{first:?}");
        assert_eq!(first.handled.verdict, Verdict::Requeue, "{first:?}");
        assert_eq!(run.requeued, 1, "one nack: {run:#?}");
        let executed: Vec<_> = ord3
            .iter()
            .filter(|s| s.handled.outcome == Some(Outcome::Executed))
            .collect();
        assert_eq!(
            executed.len(),
            1,
            "ORD-3 executed once after the failure: {ord3:#?}"
        );
        assert!(
            run.seen
                .iter()
                .any(|s| s.message_id == first.message_id && s.redelivered),
            "the nacked message {} came back redelivered: {run:#?}",
            first.message_id
        );
        assert!(
            ord3.iter().all(|s| s.handled.verdict != Verdict::Reject),
            "{ord3:#?}"
        );
        assert_eq!(run.acked, msgs.len(), "every message acked once");
        // The failed try's row was rolled back with its claim.
        assert_eq!(
            shipping.shipped().await.unwrap(),
            one_row_per_order(&["ORD-1", "ORD-2", "ORD-3"])
        );
        assert_eq!(
            ready_after_consumers_left(&conn, &queue).await,
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
