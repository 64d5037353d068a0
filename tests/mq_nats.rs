//! examples/mq_consumer.rs against the local NATS JetStream (`IDEM_NATS_URL`): orders published
//! twice under distinct `Nats-Msg-Id`s, a consumer killed after its side effect but before its ack
//! (redelivered when `ack_wait` runs out), and a failure answered with `AckKind::Nak`. The
//! `orders_shipped` table (not idem's counters) must end with one row per order number, and the
//! consumer with nothing pending or awaiting an ack.

#[path = "../examples/mq_consumer.rs"]
#[allow(dead_code)]
mod mq_consumer;
#[path = "contract/server.rs"]
#[allow(dead_code)]
mod server;

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream;
use idem::Outcome;
use mq_consumer::{Plan, Shipping, Verdict};

const CONSUMER: &str = "shipping";

/// A JetStream context, or `None` after the one skip line (a panic under
/// `IDEM_REQUIRE_SERVICES=1`).
async fn broker(url: &str) -> Option<jetstream::Context> {
    server::reach("NATS", url, async {
        tokio::time::timeout(Duration::from_secs(10), mq_consumer::nats_connect(url))
            .await
            .map_err(|_| "no answer within 10 s".to_owned())?
            .map_err(|e| e.to_string())
    })
    .await
}

/// Runs `body(url, stream, subject)` on a stream of its own (created here, with the durable
/// consumer [`CONSUMER`] and the given `ack_wait`) in a task of its own, then deletes the stream,
/// also when `body` panicked (the panic is then passed on). Skips when NATS is unreachable.
async fn on_fresh_stream<F, Fut>(prefix: &str, ack_wait: Duration, body: F)
where
    F: FnOnce(String, String, String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let url = mq_consumer::nats_url();
    let Some(js) = broker(&url).await else {
        return;
    };
    let stream = server::unique(prefix);
    let subject = format!("{stream}.orders");
    mq_consumer::nats_setup(&js, &stream, &subject, CONSUMER, ack_wait)
        .await
        .expect("create the test stream and its consumer");
    let ran = tokio::spawn(body(url, stream.clone(), subject)).await;
    let deleted = mq_consumer::nats_delete(&js, &stream).await;
    if let Err(e) = ran {
        std::panic::resume_unwind(e.into_panic());
    }
    deleted.expect("delete the test stream");
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_before_its_ack_ships_once_and_the_redelivery_is_acked() {
    // Short ack_wait: JetStream redelivers what the dead consumer never acked after 1 s.
    on_fresh_stream(
        "idem_mq_kill",
        Duration::from_secs(1),
        |url, stream, subject| async move {
            let js = mq_consumer::nats_connect(&url)
                .await
                .expect("connect to NATS");
            let dir = tempfile::tempdir().unwrap();
            let shipping = shipping(&dir).await;
            let msgs = mq_consumer::demo_messages("kill-m");
            mq_consumer::nats_publish(&js, &subject, &msgs)
                .await
                .unwrap();

            let plan = Plan::settle(msgs.len()).crash_after("ORD-2");
            let run1 = mq_consumer::run_nats_consumer(&url, &stream, CONSUMER, &shipping, &plan)
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

            let rest = Plan::settle(msgs.len() - run1.settled());
            let run2 = mq_consumer::run_nats_consumer(&url, &stream, CONSUMER, &shipping, &rest)
                .await
                .unwrap();
            let again = run2
                .seen
                .iter()
                .find(|s| s.message_id == crashed.message_id)
                .unwrap_or_else(|| panic!("{} was not redelivered: {run2:#?}", crashed.message_id));
            assert!(again.redelivered, "delivery count > 1: {again:?}");
            assert_eq!(again.handled.outcome, Some(Outcome::Replayed), "{again:?}");
            assert_eq!(again.handled.verdict, Verdict::Ack, "{again:?}");

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
            // Acks were confirmed by the server (double ack), so its counts are final.
            assert_eq!(
                mq_consumer::nats_consumer_state(&js, &stream, CONSUMER)
                    .await
                    .unwrap(),
                (0, 0),
                "(pending, ack pending) of {stream}/{CONSUMER}"
            );
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_is_nacked_and_the_redelivery_ships_once() {
    // A long ack_wait: the redelivery below can only come from the Nak, not from a timeout.
    on_fresh_stream(
        "idem_mq_nak",
        Duration::from_secs(60),
        |url, stream, subject| async move {
            let js = mq_consumer::nats_connect(&url)
                .await
                .expect("connect to NATS");
            let dir = tempfile::tempdir().unwrap();
            let shipping = shipping(&dir).await;
            let msgs = mq_consumer::demo_messages("nak-m");
            mq_consumer::nats_publish(&js, &subject, &msgs)
                .await
                .unwrap();
            shipping.fail_once("ORD-3");

            let run = mq_consumer::run_nats_consumer(
                &url,
                &stream,
                CONSUMER,
                &shipping,
                &Plan {
                    timeout: Duration::from_secs(20),
                    ..Plan::settle(msgs.len())
                },
            )
            .await
            .unwrap();

            let ord3: Vec<_> = run
                .seen
                .iter()
                .filter(|s| s.handled.order_no.as_deref() == Some("ORD-3"))
                .collect();
            let first = ord3.first().expect("ORD-3 delivered");
            assert_eq!(first.handled.outcome, Some(Outcome::Failed), "{first:?}");
            assert_eq!(first.handled.verdict, Verdict::Requeue, "{first:?}");
            assert_eq!(run.requeued, 1, "one Nak: {run:#?}");
            assert!(
                run.seen
                    .iter()
                    .any(|s| s.message_id == first.message_id && s.redelivered),
                "the nacked message {} came back with a delivery count > 1: {run:#?}",
                first.message_id
            );
            let executed = ord3
                .iter()
                .filter(|s| s.handled.outcome == Some(Outcome::Executed))
                .count();
            assert_eq!(
                executed, 1,
                "ORD-3 executed once after the failure: {ord3:#?}"
            );
            assert_eq!(run.acked, msgs.len(), "every message acked once");
            assert_eq!(
                shipping.shipped().await.unwrap(),
                one_row_per_order(&["ORD-1", "ORD-2", "ORD-3"])
            );
            assert_eq!(
                mq_consumer::nats_consumer_state(&js, &stream, CONSUMER)
                    .await
                    .unwrap(),
                (0, 0),
                "(pending, ack pending) of {stream}/{CONSUMER}"
            );
        },
    )
    .await;
}
