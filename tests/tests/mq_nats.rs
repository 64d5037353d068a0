//! examples/mq_consumer.rs against the local NATS JetStream (`IDEM_NATS_URL`): orders published
//! twice under distinct `Nats-Msg-Id`s, a consumer killed after its side effect but before its ack
//! (redelivered when `ack_wait` runs out), a failure naked with a delay, and messages no retry can
//! fix copied to the dead-letter stream and terminated. The `orders_shipped` table (not idem's
//! counters) must end with one row per order number, and the consumer with nothing pending or
//! awaiting an ack.
#![cfg(feature = "nats")]

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

use async_nats::jetstream;
use idem::inbox::jetstream::REASON_HEADER;
use mq_audit::shipping;
use mq_consumer::nats::{self, CONSUMER};
use mq_consumer::{Plan, Shipping};

/// One test's stream (with the durable consumer [`CONSUMER`] and the dead-letter stream), its
/// messages already published, and a fresh shipping database.
struct Fresh {
    url: String,
    stream: String,
    js: jetstream::Context,
    shipping: Shipping,
    msgs: Vec<(String, Vec<u8>)>,
    _dir: tempfile::TempDir,
}

/// Runs `body` on a [`Fresh`] stream (created here with the given `ack_wait`, `traffic(stream)`
/// published to it) in a task of its own, then deletes the streams, also when `body` panicked
/// (the panic is then passed on). Skips when NATS is unreachable.
async fn on_fresh_stream<F, Fut>(
    prefix: &str,
    ack_wait: Duration,
    traffic: mq_audit::Traffic,
    body: F,
) where
    F: FnOnce(Fresh) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let url = mq_consumer::nats_url();
    let Some(js) = mq_audit::broker("NATS", &url, nats::connect(&url)).await else {
        return;
    };
    let stream = server::unique(prefix);
    let subject = format!("{stream}.orders");
    nats::setup(&js, &stream, &subject, ack_wait)
        .await
        .expect("create the test streams and the consumer");
    let (fresh_js, fresh_stream) = (js.clone(), stream.clone());
    let ran = tokio::spawn(async move {
        let dir = tempfile::tempdir().unwrap();
        let shipping = shipping(&dir).await;
        let msgs = traffic(&fresh_stream);
        nats::publish(&fresh_js, &subject, &msgs).await.unwrap();
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
    let deleted = nats::delete(&js, &stream).await;
    if let Err(e) = ran {
        std::panic::resume_unwind(e.into_panic());
    }
    deleted.expect("delete the test streams");
}

/// The demo's six messages, ids `<stream>-m1` … `<stream>-m6`.
fn demo_traffic(stream: &str) -> Vec<(String, Vec<u8>)> {
    mq_consumer::demo_messages(&format!("{stream}-m"))
}

/// `(pending, ack pending)` of [`CONSUMER`]: messages not yet delivered, and delivered but not
/// yet settled. Acks and terms are confirmed by the server (double ack), so the counts are final.
async fn consumer_state(js: &jetstream::Context, stream: &str) -> (u64, usize) {
    let consumer: jetstream::consumer::PullConsumer = js
        .get_stream(stream)
        .await
        .unwrap()
        .get_consumer(CONSUMER)
        .await
        .unwrap();
    let info = consumer.get_info().await.unwrap();
    (info.num_pending, info.num_ack_pending)
}

/// `(payload, reason)` of every message in the dead-letter stream of `stream`, sorted.
async fn dead_letters(js: &jetstream::Context, stream: &str) -> Vec<(String, String)> {
    let (dead_stream, _) = nats::dead_letters(stream);
    let dead = js.get_stream(&dead_stream).await.unwrap();
    let last = dead.get_info().await.unwrap().state.last_sequence;
    let mut letters = Vec::new();
    for seq in 1..=last {
        let raw = dead.get_raw_message(seq).await.unwrap();
        let reason = raw.headers.get(REASON_HEADER).map(|v| v.to_string());
        letters.push((
            String::from_utf8_lossy(&raw.payload).into_owned(),
            reason.unwrap_or_default(),
        ));
    }
    letters.sort();
    letters
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_before_its_ack_ships_once_and_the_redelivery_is_acked() {
    // Short ack_wait: JetStream redelivers what the dead consumer never acked after 1 s.
    let ack_wait = Duration::from_secs(1);
    on_fresh_stream("idem_mq_kill", ack_wait, demo_traffic, |fresh| async move {
        let Fresh {
            url,
            stream,
            js,
            shipping,
            msgs,
            ..
        } = &fresh;

        let plan = Plan::settle(msgs.len()).crash_after("ORD-2");
        let run1 = nats::run_consumer(url, stream, shipping, &plan)
            .await
            .unwrap();
        let crashed = mq_audit::died_after_shipping_ord2(&run1, shipping).await;

        let rest = Plan::settle(msgs.len() - run1.settled());
        let run2 = nats::run_consumer(url, stream, shipping, &rest)
            .await
            .unwrap();
        mq_audit::redelivered_as_replay(&run2, crashed);
        mq_audit::shipped_each_order_once(&[&run1, &run2], msgs.len(), shipping).await;
        assert_eq!(
            consumer_state(js, stream).await,
            (0, 0),
            "(pending, ack pending) of {stream}/{CONSUMER}"
        );
        assert!(dead_letters(js, stream).await.is_empty(), "no dead letters");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_is_nacked_and_the_redelivery_ships_once() {
    // A long ack_wait: the redelivery below (within the consumer's 30 s) can only come from the
    // Nak, not from a timeout.
    let ack_wait = Duration::from_secs(60);
    on_fresh_stream("idem_mq_nak", ack_wait, demo_traffic, |fresh| async move {
        let Fresh {
            url,
            stream,
            js,
            shipping,
            msgs,
            ..
        } = &fresh;
        shipping.fail_once("ORD-3");

        let run = nats::run_consumer(url, stream, shipping, &Plan::settle(msgs.len()))
            .await
            .unwrap();

        mq_audit::failed_then_shipped_once(&run);
        mq_audit::shipped_each_order_once(&[&run], msgs.len(), shipping).await;
        assert_eq!(
            consumer_state(js, stream).await,
            (0, 0),
            "(pending, ack pending) of {stream}/{CONSUMER}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_payload_a_blank_order_number_or_another_payload_under_a_shipped_order_is_dead_lettered()
 {
    let ack_wait = Duration::from_secs(60);
    let traffic = mq_audit::refused_messages;
    on_fresh_stream("idem_mq_dead", ack_wait, traffic, |fresh| async move {
        let Fresh {
            url,
            stream,
            js,
            shipping,
            msgs,
            ..
        } = &fresh;
        let run = nats::run_consumer(url, stream, shipping, &Plan::settle(msgs.len()))
            .await
            .unwrap();
        mq_audit::refused_were_dead_lettered(&run, stream, shipping).await;
        // Copied to the dead-letter stream with their reasons, then terminated.
        let letters = dead_letters(js, stream).await;
        let payload = |name: &str| {
            let (_, payload) = msgs
                .iter()
                .find(|(id, _)| *id == format!("{stream}-{name}"))
                .unwrap();
            String::from_utf8_lossy(payload).into_owned()
        };
        let has = |name: &str, reason: &str| {
            letters
                .iter()
                .any(|(p, r)| *p == payload(name) && r.starts_with(reason))
        };
        assert_eq!(letters.len(), 3, "exactly the three refused: {letters:?}");
        assert!(has("garbage", "unreadable payload"), "{letters:?}");
        assert!(has("blank", "refused"), "{letters:?}");
        assert!(
            has("other", "another payload under a key already processed"),
            "{letters:?}"
        );
        assert_eq!(
            consumer_state(js, stream).await,
            (0, 0),
            "(pending, ack pending) of {stream}/{CONSUMER}"
        );
    })
    .await;
}
