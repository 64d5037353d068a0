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

#[path = "support/mq_audit.rs"]
mod mq_audit;

use async_nats::jetstream;
use mq_audit::shipping;
use mq_consumer::{Plan, Shipping};

const CONSUMER: &str = "shipping";

/// One test's stream (with the durable consumer [`CONSUMER`]), its six demo messages already
/// published, and a fresh shipping database.
struct Fresh {
    url: String,
    stream: String,
    js: jetstream::Context,
    shipping: Shipping,
    msgs: Vec<(String, mq_consumer::OrderMsg)>,
    _dir: tempfile::TempDir,
}

/// Runs `body` on a [`Fresh`] stream (created here with the given `ack_wait`) in a task of its
/// own, then deletes the stream, also when `body` panicked (the panic is then passed on). Skips
/// when NATS is unreachable.
async fn on_fresh_stream<F, Fut>(prefix: &str, ack_wait: Duration, body: F)
where
    F: FnOnce(Fresh) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let url = mq_consumer::nats_url();
    let Some(js) = mq_audit::broker("NATS", &url, mq_consumer::nats_connect(&url)).await else {
        return;
    };
    let stream = server::unique(prefix);
    let subject = format!("{stream}.orders");
    mq_consumer::nats_setup(&js, &stream, &subject, CONSUMER, ack_wait)
        .await
        .expect("create the test stream and its consumer");
    let (fresh_js, fresh_stream) = (js.clone(), stream.clone());
    let ran = tokio::spawn(async move {
        let dir = tempfile::tempdir().unwrap();
        let shipping = shipping(&dir).await;
        let msgs = mq_consumer::demo_messages(&format!("{fresh_stream}-m"));
        mq_consumer::nats_publish(&fresh_js, &subject, &msgs)
            .await
            .unwrap();
        body(Fresh {
            url,
            stream: fresh_stream,
            js: fresh_js,
            shipping,
            msgs,
            _dir: dir,
        })
        .await
    })
    .await;
    let deleted = mq_consumer::nats_delete(&js, &stream).await;
    if let Err(e) = ran {
        std::panic::resume_unwind(e.into_panic());
    }
    deleted.expect("delete the test stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_before_its_ack_ships_once_and_the_redelivery_is_acked() {
    // Short ack_wait: JetStream redelivers what the dead consumer never acked after 1 s.
    on_fresh_stream("idem_mq_kill", Duration::from_secs(1), |fresh| async move {
        let Fresh {
            url,
            stream,
            js,
            shipping,
            msgs,
            ..
        } = &fresh;

        let plan = Plan::settle(msgs.len()).crash_after("ORD-2");
        let run1 = mq_consumer::run_nats_consumer(url, stream, CONSUMER, shipping, &plan)
            .await
            .unwrap();
        let crashed = mq_audit::died_after_shipping_ord2(&run1, shipping).await;

        let rest = Plan::settle(msgs.len() - run1.settled());
        let run2 = mq_consumer::run_nats_consumer(url, stream, CONSUMER, shipping, &rest)
            .await
            .unwrap();
        mq_audit::redelivered_as_replay(&run2, crashed);
        mq_audit::shipped_each_order_once(&[&run1, &run2], msgs.len(), shipping).await;
        // Acks were confirmed by the server (double ack), so its counts are final.
        assert_eq!(
            mq_consumer::nats_consumer_state(js, stream, CONSUMER)
                .await
                .unwrap(),
            (0, 0),
            "(pending, ack pending) of {stream}/{CONSUMER}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_is_nacked_and_the_redelivery_ships_once() {
    // A long ack_wait: the redelivery below can only come from the Nak, not from a timeout.
    on_fresh_stream("idem_mq_nak", Duration::from_secs(60), |fresh| async move {
        let Fresh {
            url,
            stream,
            js,
            shipping,
            msgs,
            ..
        } = &fresh;
        shipping.fail_once("ORD-3");

        let run = mq_consumer::run_nats_consumer(
            url,
            stream,
            CONSUMER,
            shipping,
            &Plan {
                timeout: Duration::from_secs(20),
                ..Plan::settle(msgs.len())
            },
        )
        .await
        .unwrap();

        mq_audit::failed_then_shipped_once(&run);
        mq_audit::shipped_each_order_once(&[&run], msgs.len(), shipping).await;
        assert_eq!(
            mq_consumer::nats_consumer_state(js, stream, CONSUMER)
                .await
                .unwrap(),
            (0, 0),
            "(pending, ack pending) of {stream}/{CONSUMER}"
        );
    })
    .await;
}
