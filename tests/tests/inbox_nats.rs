//! `idem::inbox` on the local NATS JetStream (`IDEM_NATS_URL`): verdicts, attempts counted per key
//! and dead letters, settled by `idem::inbox::jetstream` (ack, nak with a delay, a copy to a
//! dead-letter stream then term). The audit is the shipping service's own SQLite table and what
//! the dead-letter stream holds.

#[path = "support/inbox_orders.rs"]
mod inbox_orders;
#[path = "contract/server.rs"]
mod server;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer};
use futures_util::StreamExt;
use idem::inbox::{Inbox, Verdict, jetstream as js_inbox};
use inbox_orders::{OrderMsg, Orders, Seen};

fn url() -> String {
    server::nats_url()
}

/// A test's streams: work on `<name>.orders` (consumer `shipping`), dead letters on
/// `<name>.dead`.
struct Fresh {
    js: jetstream::Context,
    name: String,
}

impl Fresh {
    fn subject(&self) -> String {
        format!("{}.orders", self.name)
    }

    fn dead(&self) -> String {
        format!("{}.dead", self.name)
    }

    async fn consumer(&self) -> PullConsumer {
        self.js
            .get_stream(&self.name)
            .await
            .unwrap()
            .get_consumer("shipping")
            .await
            .unwrap()
    }
}

/// Fresh streams and consumer, deleted after `body`, also when it panicked. Skips when the
/// server is unreachable.
async fn on_fresh_streams<F, Fut>(prefix: &str, body: F)
where
    F: FnOnce(Fresh) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let url = url();
    let Some(client) = server::reach("NATS", &url, async_nats::connect(&url)).await else {
        return;
    };
    let js = jetstream::new(client);
    let name = server::unique(prefix);
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.orders")],
            retention: jetstream::stream::RetentionPolicy::WorkQueue,
            storage: jetstream::stream::StorageType::Memory,
            ..Default::default()
        })
        .await
        .unwrap();
    stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("shipping".to_owned()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(10),
            ..Default::default()
        })
        .await
        .unwrap();
    let dead_stream = format!("{name}_DEAD");
    js.create_stream(jetstream::stream::Config {
        name: dead_stream.clone(),
        subjects: vec![format!("{name}.dead")],
        storage: jetstream::stream::StorageType::Memory,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .unwrap();
    let ran = tokio::spawn(body(Fresh {
        js: js.clone(),
        name: name.clone(),
    }))
    .await;
    let _ = js.delete_stream(&name).await;
    let _ = js.delete_stream(&dead_stream).await;
    if let Err(e) = ran {
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn publish(fresh: &Fresh, msgs: &[(String, Vec<u8>)]) {
    for (id, payload) in msgs {
        fresh
            .js
            .send_publish(
                fresh.subject(),
                jetstream::message::PublishMessage::build()
                    .message_id(id)
                    .payload(payload.clone().into()),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
}

/// A message's `Nats-Msg-Id` (empty when it has none).
fn message_id(msg: &jetstream::Message) -> String {
    msg.headers
        .as_ref()
        .and_then(|h| h.get("Nats-Msg-Id"))
        .map(|id| id.to_string())
        .unwrap_or_default()
}

/// Pulls until `terminal` deliveries were acked or dead-lettered (bounded by 30 s), each through
/// the inbox and settled by `jetstream::settle`.
async fn consume(fresh: &Fresh, orders: &Arc<Orders>, inbox: &Inbox, terminal: usize) -> Seen {
    let mut messages = fresh.consumer().await.messages().await.unwrap();
    let mut seen = Seen::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut done = 0;
    let dead = fresh.dead();
    while done < terminal {
        let msg = tokio::time::timeout_at(deadline, messages.next())
            .await
            .unwrap_or_else(|_| panic!("{done} of {terminal} settled after 30 s: {seen:#?}"))
            .expect("the consumer closed")
            .unwrap();
        let id = message_id(&msg);
        let handled = orders
            .handle(inbox, &msg.payload, js_inbox::delivered(&msg))
            .await;
        if !matches!(handled.verdict, Verdict::Requeue { .. }) {
            done += 1;
        }
        js_inbox::settle(&msg, &handled.verdict, Some(&dead))
            .await
            .unwrap();
        seen.0.push((id, handled.outcome, handled.verdict));
    }
    seen
}

/// `(original message id, reason)` of every dead letter, sorted.
async fn dead_letters(fresh: &Fresh) -> Vec<(String, String)> {
    let stream = fresh
        .js
        .get_stream(format!("{}_DEAD", fresh.name))
        .await
        .unwrap();
    let last = stream.get_info().await.unwrap().state.last_sequence;
    let mut letters = Vec::new();
    for seq in 1..=last {
        let raw = stream.get_raw_message(seq).await.unwrap();
        let headers = raw.headers;
        let header = |name: &str| headers.get(name).map(|v| v.to_string()).unwrap_or_default();
        // The copy's own Nats-Msg-Id names the original by stream and sequence, so a copy sent
        // again after a crash falls in the dead-letter stream's duplicate window.
        let id = header("Nats-Msg-Id");
        assert!(id.starts_with(&format!("dead:{}:", fresh.name)), "{id}");
        letters.push((
            String::from_utf8_lossy(&raw.payload).into_owned(),
            header(js_inbox::REASON_HEADER),
        ));
    }
    letters.sort();
    letters
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_ack_failures_retry_then_dead_letter_and_poison_dead_letters_at_once() {
    on_fresh_streams("idem_inbox_mix", |fresh| async move {
        let orders = Orders::new().await;
        inbox_orders::plant(&orders, &fresh.name);
        let msgs = inbox_orders::traffic(&fresh.name);
        publish(&fresh, &msgs).await;
        let seen = consume(&fresh, &orders, &inbox_orders::inbox(), msgs.len()).await;
        inbox_orders::assert_settled(&orders, &fresh.name, &seen).await;
        let letters = dead_letters(&fresh).await;
        let bad = serde_json::to_string(&OrderMsg {
            order_no: format!("{}-BAD", fresh.name),
            qty: 2,
        })
        .unwrap();
        assert_eq!(letters.len(), 2, "exactly the poison and BAD: {letters:?}");
        assert!(
            letters
                .iter()
                .any(|(payload, reason)| *payload == bad && reason.starts_with("failed 3 times"))
        );
        assert!(
            letters
                .iter()
                .any(|(payload, reason)| payload == "{\"order_no\": 17"
                    && reason.starts_with("unreadable payload"))
        );
        let info = fresh.consumer().await.get_info().await.unwrap().clone();
        assert_eq!(
            (info.num_pending, info.num_ack_pending),
            (0, 0),
            "every message settled"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_while_its_key_is_in_progress_is_naked_with_a_delay_then_acked_as_a_replay() {
    on_fresh_streams("idem_inbox_busy", |fresh| async move {
        let orders = Orders::new().await;
        let order_no = format!("{}-SLOW", fresh.name);
        let (payload, releaser) = inbox_orders::held_in_progress(&orders, &order_no).await;
        publish(&fresh, &[(format!("{order_no}-m2"), payload)]).await;
        let seen = consume(&fresh, &orders, &inbox_orders::inbox(), 1).await;
        releaser.await.unwrap();
        inbox_orders::assert_requeued_while_busy_then_replayed(&orders, &order_no, &seen).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_idem_record_the_delivery_count_limits_the_attempts() {
    on_fresh_streams("idem_inbox_count", |fresh| async move {
        publish(&fresh, &[(format!("{}-m1", fresh.name), b"{}".to_vec())]).await;
        let inbox = inbox_orders::inbox();
        let mut messages = fresh.consumer().await.messages().await.unwrap();
        let mut counts = Vec::new();
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(10), messages.next())
                .await
                .expect("a delivery within 10 s")
                .unwrap()
                .unwrap();
            let handled = inbox
                .handle(js_inbox::delivered(&msg), async {
                    Err::<(), _>("the database is down")
                })
                .await;
            counts.push(handled.attempts);
            js_inbox::settle(&msg, &handled.verdict, Some(&fresh.dead()))
                .await
                .unwrap();
            if let Verdict::DeadLetter { reason } = handled.verdict {
                assert_eq!(reason, "failed 3 times: the database is down");
                break;
            }
        }
        assert_eq!(counts, [1, 2, 3], "num_delivered numbered the deliveries");
        assert_eq!(dead_letters(&fresh).await.len(), 1);
    })
    .await;
}

/// Pulls batches of up to `size` messages (`fetch`) until `terminal` deliveries were acked or
/// dead-lettered (bounded by 30 s): each batch through `Inbox::handle_batch` (one batch claim),
/// each message settled by `jetstream::settle`.
async fn consume_batches(
    fresh: &Fresh,
    orders: &Arc<Orders>,
    inbox: &Inbox,
    terminal: usize,
    size: usize,
) -> (Seen, usize) {
    let consumer = fresh.consumer().await;
    let mut seen = Seen::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (mut done, mut batches) = (0, 0);
    let dead = fresh.dead();
    while done < terminal {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{done} of {terminal} settled after 30 s: {seen:#?}"
        );
        let mut fetched = consumer
            .fetch()
            .max_messages(size)
            .expires(Duration::from_millis(200))
            .messages()
            .await
            .unwrap();
        let mut msgs = Vec::new();
        while let Some(msg) = fetched.next().await {
            msgs.push(msg.unwrap());
        }
        if msgs.is_empty() {
            continue;
        }
        batches += 1;
        let deliveries: Vec<(&[u8], Option<u32>)> = msgs
            .iter()
            .map(|m| (&m.payload[..], js_inbox::delivered(m)))
            .collect();
        let handled = orders.handle_batch(inbox, &deliveries).await;
        for (msg, handled) in msgs.iter().zip(handled) {
            let id = message_id(msg);
            if !matches!(handled.verdict, Verdict::Requeue { .. }) {
                done += 1;
            }
            js_inbox::settle(msg, &handled.verdict, Some(&dead))
                .await
                .unwrap();
            seen.0.push((id, handled.outcome, handled.verdict));
        }
    }
    (seen, batches)
}

/// The same traffic fetched in batches of 8 and handled with one batch claim each: every verdict
/// holds as with one message at a time (duplicates inside a batch and across batches acked as
/// replays, a failure retried, a failure past its attempts and the poison dead-lettered), each
/// good order shipped once, nothing left pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetched_batches_are_claimed_at_once_and_every_verdict_holds() {
    on_fresh_streams("idem_inbox_batch", |fresh| async move {
        let orders = Orders::new().await;
        inbox_orders::plant(&orders, &fresh.name);
        let msgs = inbox_orders::traffic(&fresh.name);
        publish(&fresh, &msgs).await;
        let (seen, batches) =
            consume_batches(&fresh, &orders, &inbox_orders::inbox(), msgs.len(), 8).await;
        assert!(
            batches < msgs.len(),
            "{batches} batches for {} messages",
            msgs.len()
        );
        inbox_orders::assert_settled(&orders, &fresh.name, &seen).await;
        assert_eq!(dead_letters(&fresh).await.len(), 2, "the poison and BAD");
        let info = fresh.consumer().await.get_info().await.unwrap().clone();
        assert_eq!(
            (info.num_pending, info.num_ack_pending),
            (0, 0),
            "every message settled"
        );
    })
    .await;
}
