//! `idem::outbox`'s publishers on the local RabbitMQ (`IDEM_AMQP_URL`) and NATS JetStream
//! (`IDEM_NATS_URL`), from an SQLite outbox: every row arrives with its stable message id and key,
//! in order per key; an unroutable destination leaves the row pending; and a row published again
//! after a relay lost its reply is dropped by the stream's duplicate window.

#[path = "contract/server.rs"]
mod server;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use async_trait::async_trait;
use futures_util::StreamExt;
use idem::outbox::amqp::AmqpPublisher;
use idem::outbox::jetstream::{JetStreamPublisher, KEY_HEADER};
use idem::outbox::{Outbox, OutboxMessage, Publisher, Relay};
use idem::{SqliteStore, error::BoxError};
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};

async fn sqlite_outbox(dir: &tempfile::TempDir) -> (SqliteStore, Outbox) {
    let store = SqliteStore::open(dir.path().join("outbox.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let outbox = Outbox::new();
    outbox.migrate(store.pool()).await.unwrap();
    (store, outbox)
}

/// Enqueues `per_key` messages for each of `keys` keys to `destination`, interleaved.
async fn enqueue(store: &SqliteStore, outbox: &Outbox, destination: &str, keys: u32, per_key: u32) {
    let mut tx = store.begin().await.unwrap();
    for n in 1..=per_key {
        for k in 0..keys {
            let payload = format!("K{k}#{n}");
            outbox
                .enqueue(&mut tx, destination, &format!("K{k}"), payload.as_bytes())
                .await
                .unwrap();
        }
    }
    tx.commit().await.unwrap();
}

async fn drain(relay: &Relay) {
    for _ in 0..200 {
        if relay.pending().await.unwrap() == 0 {
            return;
        }
        relay.run_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("rows still pending after 200 passes");
}

/// Checks `(key, payload)` pairs arrived once each and in order per key.
fn in_order_per_key(got: &[(String, String)], keys: u32, per_key: u32) {
    assert_eq!(got.len() as u32, keys * per_key, "every row once: {got:?}");
    for k in 0..keys {
        let key = format!("K{k}");
        let seen: Vec<_> = got
            .iter()
            .filter(|(g, _)| *g == key)
            .map(|(_, p)| p.clone())
            .collect();
        let expected: Vec<_> = (1..=per_key).map(|n| format!("{key}#{n}")).collect();
        assert_eq!(seen, expected, "{key} in enqueue order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_gets_every_row_with_its_id_and_key_in_order_and_an_unroutable_one_stays_pending()
{
    let url = server::amqp_url();
    let connect = Connection::connect(&url, ConnectionProperties::default());
    let Some(conn) = server::reach("RabbitMQ", &url, connect).await else {
        return;
    };
    let queue = server::unique("idem_outbox");
    let channel = conn.create_channel().await.unwrap();
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (store, outbox) = sqlite_outbox(&dir).await;
    enqueue(&store, &outbox, &queue, 4, 5).await;
    let publisher = AmqpPublisher::new(conn.create_channel().await.unwrap())
        .await
        .unwrap();
    let relay = Relay::builder(store.pool(), publisher.clone())
        .build()
        .unwrap();
    drain(&relay).await;
    let mut got = Vec::new();
    while let Some(msg) = channel
        .basic_get(queue.as_str().into(), BasicGetOptions::default())
        .await
        .unwrap()
    {
        let props = &msg.delivery.properties;
        let id = props.message_id().as_ref().unwrap().as_str().to_owned();
        assert!(id.starts_with("idem_outbox:"), "{id}");
        assert_eq!(props.delivery_mode(), &Some(2), "persistent");
        let key = props.correlation_id().as_ref().unwrap().as_str().to_owned();
        got.push((key, String::from_utf8(msg.delivery.data.clone()).unwrap()));
        msg.delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    in_order_per_key(&got, 4, 5);

    // A destination no queue is bound to: the broker confirms but routes nowhere, so the publish
    // fails and the row waits for its retry.
    let nowhere = server::unique("idem_outbox_nowhere");
    let mut tx = store.begin().await.unwrap();
    outbox
        .enqueue(&mut tx, &nowhere, "K", b"lost?")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let pass = relay.run_once().await.unwrap();
    assert_eq!((pass.sent, pass.failed), (0, 1));
    assert_eq!(relay.pending().await.unwrap(), 1);
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let _ = conn.close(200, "done".into()).await;
}

/// Publishes through the inner publisher, then reports a failure once per `every` messages: a
/// relay that lost the broker's reply (or died) after the message got there.
struct LostReplies<P> {
    inner: P,
    calls: AtomicU32,
    every: u32,
}

#[async_trait]
impl<P: Publisher> Publisher for LostReplies<P> {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), BoxError> {
        self.inner.publish(message).await?;
        if self
            .calls
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(self.every)
        {
            return Err("the reply was lost".into());
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_drops_a_relays_resend_by_its_message_id_and_keeps_the_order_per_key() {
    let url = server::nats_url();
    let Some(client) = server::reach("NATS", &url, async_nats::connect(&url)).await else {
        return;
    };
    let js = jetstream::new(client);
    let name = server::unique("idem_outbox");
    let subject = format!("{name}.events");
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: jetstream::stream::StorageType::Memory,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (store, outbox) = sqlite_outbox(&dir).await;
    enqueue(&store, &outbox, &subject, 3, 4).await;
    let publisher = Arc::new(LostReplies {
        inner: JetStreamPublisher::new(js.clone()),
        calls: AtomicU32::new(0),
        every: 3,
    });
    let relay = Relay::builder(store.pool(), publisher.clone())
        .retry_delay(Duration::ZERO)
        .build()
        .unwrap();
    drain(&relay).await;
    let publishes = publisher.calls.load(Ordering::Relaxed);
    assert!(
        publishes > 12,
        "some rows were published twice ({publishes})"
    );
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config::default())
        .await
        .unwrap();
    let mut batch = consumer
        .fetch()
        .max_messages(100)
        .expires(Duration::from_secs(1))
        .messages()
        .await
        .unwrap();
    let mut got = Vec::new();
    while let Some(msg) = batch.next().await {
        let msg = msg.unwrap();
        let headers = msg.headers.clone().unwrap();
        let key = headers.get(KEY_HEADER).unwrap().to_string();
        assert!(
            headers
                .get("Nats-Msg-Id")
                .unwrap()
                .as_str()
                .starts_with("idem_outbox:")
        );
        got.push((key, String::from_utf8(msg.payload.to_vec()).unwrap()));
    }
    in_order_per_key(&got, 3, 4);
    js.delete_stream(&name).await.unwrap();
}
