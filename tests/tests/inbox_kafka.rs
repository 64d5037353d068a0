//! `idem::inbox` and `idem::outbox` on a Kafka-compatible broker (`IDEM_KAFKA_URL`, default
//! `127.0.0.1:9092`; `.ci/run` starts tansu there): verdicts settled by
//! `idem::inbox::kafka::KafkaSettler` (commit, pause and seek back, a dead-letter topic), a
//! consumer that leaves between its handler and its commit, and the outbox's `KafkaPublisher`.
//! The audit is the shipping service's own SQLite table, the dead-letter topic, and the group's
//! committed offsets against the partitions' ends.

#[path = "support/inbox_orders.rs"]
#[allow(dead_code)] // the batch helpers: this consumer settles one message at a time
mod inbox_orders;
#[path = "support/kafka.rs"]
mod kafka;
#[path = "contract/server.rs"]
mod server;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use idem::inbox::kafka::{self as kafka_inbox, KafkaSettler};
use idem::inbox::{Inbox, Verdict};
use idem::metrics::Outcome;
use inbox_orders::{OrderMsg, Orders, Seen};
use kafka::brokers;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

/// The header the tests name each published message by.
const MSG_ID: &str = "test-message-id";
const PARTITIONS: i32 = 3;

/// A test's topics: work on `<name>` (3 partitions), dead letters on `<name>.dead`.
struct Fresh {
    name: String,
    producer: FutureProducer,
}

impl Fresh {
    /// The test's consumer group (a group of its own: tests run at once, and one group across
    /// their topics would rebalance them all whenever one test's consumer comes or goes).
    fn group(&self) -> String {
        format!("{}-shipping", self.name)
    }

    fn dead(&self) -> String {
        format!("{}.dead", self.name)
    }

    fn consumer(&self, group: &str) -> Arc<StreamConsumer> {
        let consumer: StreamConsumer = kafka::consumer_config(&brokers(), group).create().unwrap();
        consumer.subscribe(&[&self.name]).unwrap();
        Arc::new(consumer)
    }

    fn settler(&self, consumer: &Arc<StreamConsumer>) -> KafkaSettler {
        KafkaSettler::new(Arc::clone(consumer)).dead_letters(self.dead(), self.producer.clone())
    }
}

/// Fresh topics, deleted after `body`, also when it panicked. Skips when the broker is
/// unreachable.
async fn on_fresh_topics<F, Fut>(prefix: &str, body: F)
where
    F: FnOnce(Fresh) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let name = server::unique(prefix);
    let url = brokers();
    let created = kafka::create_with_dead(&url, &name, PARTITIONS);
    if server::reach("Kafka", &url, created).await.is_none() {
        return;
    }
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    let ran = tokio::spawn(body(Fresh {
        name: name.clone(),
        producer,
    }))
    .await;
    kafka::delete_with_dead(&brokers(), &name).await;
    if let Err(e) = ran {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// Produces each `(id, payload)`, keyed by its order number (the id when the payload is no
/// order), so each order's messages share a partition, in order.
async fn publish(fresh: &Fresh, msgs: &[(String, Vec<u8>)]) {
    for (id, payload) in msgs {
        let key = serde_json::from_slice::<OrderMsg>(payload).map_or(id.clone(), |m| m.order_no);
        let record = FutureRecord::to(&fresh.name)
            .key(&key)
            .payload(payload)
            .headers(OwnedHeaders::new().insert(Header {
                key: MSG_ID,
                value: Some(id),
            }));
        fresh
            .producer
            .send(record, Duration::from_secs(10))
            .await
            .unwrap();
    }
}

fn header<M: Message>(message: &M, name: &str) -> String {
    message
        .headers()
        .and_then(|h| h.iter().find(|h| h.key == name))
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

/// Consumes as `group` until `terminal` deliveries were acked or dead-lettered (bounded by 60 s),
/// each through the inbox and settled by the settler.
async fn consume(
    fresh: &Fresh,
    group: &str,
    orders: &Arc<Orders>,
    inbox: &Inbox,
    terminal: usize,
) -> Seen {
    consume_on(fresh, fresh.consumer(group), orders, inbox, terminal).await
}

/// A consumer of `group` that has joined it: its partitions are assigned.
async fn joined(fresh: &Fresh, group: &str) -> Arc<StreamConsumer> {
    let consumer = fresh.consumer(group);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while consumer.assignment().unwrap().count() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no assignment after 30 s"
        );
        // Polling is what drives the group protocol.
        let polled = tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await;
        assert!(polled.is_err(), "nothing is published yet");
    }
    consumer
}

/// [`consume`] on `consumer`.
async fn consume_on(
    fresh: &Fresh,
    consumer: Arc<StreamConsumer>,
    orders: &Arc<Orders>,
    inbox: &Inbox,
    terminal: usize,
) -> Seen {
    let settler = fresh.settler(&consumer);
    let mut messages = consumer.stream();
    let mut seen = Seen::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut done = 0;
    while done < terminal {
        let message = tokio::time::timeout_at(deadline, messages.next())
            .await
            .unwrap_or_else(|_| panic!("{done} of {terminal} settled after 60 s: {seen:#?}"))
            .expect("the consumer closed")
            .unwrap();
        let Some(delivered) = settler.admit(&message) else {
            continue;
        };
        let handled = orders
            .handle(
                inbox,
                message.payload().unwrap_or_default(),
                Some(delivered),
            )
            .await;
        if !matches!(handled.verdict, Verdict::Requeue { .. }) {
            done += 1;
        }
        settler.settle(&message, &handled.verdict).await.unwrap();
        seen.0
            .push((header(&message, MSG_ID), handled.outcome, handled.verdict));
    }
    drop(messages);
    assert_all_committed(fresh).await;
    seen
}

/// Every partition's committed offset reaches its end (commits are asynchronous: waits up to
/// 10 s for them to land).
async fn assert_all_committed(fresh: &Fresh) {
    let mut last = Vec::new();
    for _ in 0..100 {
        last = behind(fresh, &fresh.group()).await;
        if last.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("offsets not committed to the partitions' ends (partition, committed, end): {last:?}");
}

/// The partitions of the work topic whose committed offset for `group` is short of their end:
/// `(partition, committed, end)`, read by a client outside the group.
async fn behind(fresh: &Fresh, group: &str) -> Vec<(i32, i64, i64)> {
    let (topic, group) = (fresh.name.clone(), group.to_owned());
    tokio::task::spawn_blocking(move || {
        let timeout = Duration::from_secs(5);
        let reader: BaseConsumer = kafka::consumer_config(&brokers(), &group).create().unwrap();
        let mut list = TopicPartitionList::new();
        for partition in 0..PARTITIONS {
            list.add_partition(&topic, partition);
        }
        let committed = reader.committed_offsets(list, timeout).unwrap();
        let mut behind = Vec::new();
        for partition in 0..PARTITIONS {
            let (_, end) = reader.fetch_watermarks(&topic, partition, timeout).unwrap();
            let at = match committed
                .find_partition(&topic, partition)
                .map(|e| e.offset())
            {
                Some(Offset::Offset(at)) => at,
                _ => 0,
            };
            if at != end {
                behind.push((partition, at, end));
            }
        }
        behind
    })
    .await
    .unwrap()
}

/// `(payload, reason, origin)` of every dead letter, sorted; reads until `expected` arrived
/// (bounded by 20 s) and then 1 s more, so an extra one is seen.
async fn dead_letters(fresh: &Fresh, expected: usize) -> Vec<(String, String, String)> {
    let consumer: StreamConsumer =
        kafka::consumer_config(&brokers(), &server::unique("dead-reader"))
            .create()
            .unwrap();
    consumer.subscribe(&[&fresh.dead()]).unwrap();
    let mut messages = consumer.stream();
    let mut letters = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let wait = if letters.len() >= expected {
            tokio::time::Instant::now() + Duration::from_secs(1)
        } else {
            deadline
        };
        let Ok(Some(message)) = tokio::time::timeout_at(wait, messages.next()).await else {
            break;
        };
        let message = message.unwrap();
        letters.push((
            String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned(),
            header(&message, kafka_inbox::REASON_HEADER),
            header(&message, kafka_inbox::ORIGIN_HEADER),
        ));
    }
    letters.sort();
    letters
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_commit_failures_rewind_then_dead_letter_and_poison_dead_letters_at_once() {
    on_fresh_topics("idem_kafka_mix", |fresh| async move {
        let orders = Orders::new().await;
        inbox_orders::plant(&orders, &fresh.name);
        let msgs = inbox_orders::traffic(&fresh.name);
        publish(&fresh, &msgs).await;
        let seen = consume(
            &fresh,
            &fresh.group(),
            &orders,
            &inbox_orders::inbox(),
            msgs.len(),
        )
        .await;
        inbox_orders::assert_settled(&orders, &fresh.name, &seen).await;
        let letters = dead_letters(&fresh, 2).await;
        let bad = serde_json::to_string(&OrderMsg {
            order_no: format!("{}-BAD", fresh.name),
            qty: 2,
        })
        .unwrap();
        assert_eq!(letters.len(), 2, "exactly the poison and BAD: {letters:?}");
        assert!(
            letters
                .iter()
                .any(|(payload, reason, origin)| *payload == bad
                    && reason.starts_with("failed 3 times")
                    && origin.starts_with(&format!("{}/", fresh.name))),
            "{letters:?}"
        );
        assert!(
            letters
                .iter()
                .any(|(payload, reason, _)| payload == "{\"order_no\": 17"
                    && reason.starts_with("unreadable payload")),
            "{letters:?}"
        );
        // Order per key held: each order's second message came after its first was settled.
        for name in ["A", "B", "C", "FLAKY"] {
            let order_no = format!("{}-{name}", fresh.name);
            let ids: Vec<&str> = seen
                .of(&order_no)
                .iter()
                .map(|(id, ..)| id.as_str())
                .collect();
            let first_m2 = ids.iter().position(|id| id.ends_with("-m2")).unwrap();
            assert!(
                ids[..first_m2].iter().all(|id| id.ends_with("-m1")),
                "{order_no}: {ids:?}"
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_while_its_key_is_in_progress_is_rewound_with_a_delay_then_replayed() {
    on_fresh_topics("idem_kafka_busy", |fresh| async move {
        let orders = Orders::new().await;
        let order_no = format!("{}-SLOW", fresh.name);
        // Joined, and the producer's first send (its id from the broker, the topic's metadata)
        // done, before the holder starts: both take longer than it holds.
        let consumer = joined(&fresh, &fresh.group()).await;
        let warm_up = FutureRecord::to(&fresh.name)
            .partition(0)
            .key("warm-up")
            .payload("{}");
        fresh
            .producer
            .send(warm_up, Duration::from_secs(10))
            .await
            .unwrap();
        let warmed = tokio::time::timeout(Duration::from_secs(10), consumer.recv()).await;
        consumer
            .commit_message(
                &warmed.unwrap().unwrap(),
                rdkafka::consumer::CommitMode::Sync,
            )
            .unwrap();
        let (payload, releaser) = inbox_orders::held_in_progress(&orders, &order_no).await;
        publish(&fresh, &[(format!("{order_no}-m2"), payload)]).await;
        let seen = consume_on(&fresh, consumer, &orders, &inbox_orders::inbox(), 1).await;
        releaser.await.unwrap();
        inbox_orders::assert_requeued_while_busy_then_replayed(&orders, &order_no, &seen).await;
    })
    .await;
}

/// A consumer that handled a message (its order shipped) and left the group before committing
/// it: the group rebalances, the next consumer gets the message again from the last committed
/// offset, and the inbox replays the record: one shipment, everything committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_gone_between_its_handler_and_its_commit_is_replayed_by_the_next() {
    on_fresh_topics("idem_kafka_gone", |fresh| async move {
        let orders = Orders::new().await;
        let msgs = [("A", 1), ("B", 1)].map(|(name, qty)| {
            let order_no = format!("{}-{name}", fresh.name);
            let payload = serde_json::to_vec(&OrderMsg {
                order_no: order_no.clone(),
                qty,
            })
            .unwrap();
            (format!("{order_no}-m1"), payload)
        });
        publish(&fresh, &msgs).await;
        let inbox = inbox_orders::inbox();
        {
            let consumer = fresh.consumer(&fresh.group());
            let settler = fresh.settler(&consumer);
            let mut messages = consumer.stream();
            let message = tokio::time::timeout(Duration::from_secs(30), messages.next())
                .await
                .expect("a message within 30 s")
                .unwrap()
                .unwrap();
            let delivered = settler.admit(&message).unwrap();
            let handled = orders
                .handle(&inbox, message.payload().unwrap(), Some(delivered))
                .await;
            assert_eq!(handled.outcome, Some(Outcome::Executed));
            // Gone here: no commit; the consumer leaves the group as it is dropped.
        }
        let seen = consume(&fresh, &fresh.group(), &orders, &inbox, 2).await;
        let outcomes: Vec<Option<Outcome>> = seen.0.iter().map(|(_, o, _)| *o).collect();
        assert!(
            outcomes.contains(&Some(Outcome::Replayed)),
            "the handled message came again and was replayed: {seen:#?}"
        );
        let p = |name: &str| format!("{}-{name}", fresh.name);
        assert_eq!(orders.shipped().await, vec![(p("A"), 1), (p("B"), 1)]);
    })
    .await;
}

/// Two consumers of one group: the second joins while the first works, the group rebalances and
/// partitions move from the first to the second mid-run (what the first had handled and not yet
/// committed is read again by the second, and replayed). Every order ships once, every partition
/// ends committed, and both consumers handled messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_mid_run_runs_no_handler_twice_and_loses_nothing() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    on_fresh_topics("idem_kafka_rebalance", |fresh| async move {
        let orders = Orders::new().await;
        let n = 240;
        let msgs: Vec<(String, Vec<u8>)> = (0..n)
            .map(|i| {
                let order_no = format!("{}-{i:04}", fresh.name);
                let payload = serde_json::to_vec(&OrderMsg {
                    order_no: order_no.clone(),
                    qty: 1,
                })
                .unwrap();
                (format!("{order_no}-m1"), payload)
            })
            .collect();
        publish(&fresh, &msgs).await;
        let fresh = Arc::new(fresh);
        let stop = Arc::new(AtomicBool::new(false));
        // One consumer: each message through the inbox (10 ms of work each, so the run lasts
        // while the group rebalances), settled; how many it handled.
        let start = |handled: Arc<AtomicUsize>| {
            let (fresh, orders, stop) = (fresh.clone(), orders.clone(), stop.clone());
            tokio::spawn(async move {
                let consumer = fresh.consumer(&fresh.group());
                let settler = fresh.settler(&consumer);
                let inbox = inbox_orders::inbox();
                let mut messages = consumer.stream();
                while !stop.load(Ordering::SeqCst) {
                    let next = tokio::time::timeout(Duration::from_millis(200), messages.next());
                    let Ok(Some(Ok(message))) = next.await else {
                        continue;
                    };
                    let Some(delivered) = settler.admit(&message) else {
                        continue;
                    };
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    let payload = message.payload().unwrap_or_default();
                    let done = orders.handle(&inbox, payload, Some(delivered)).await;
                    settler.settle(&message, &done.verdict).await.unwrap();
                    handled.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        let (first, second) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let a = start(first.clone());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while first.load(Ordering::SeqCst) < 40 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the first consumer is stuck"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let b = start(second.clone());
        loop {
            let shipped = orders.shipped().await.len();
            if shipped == n && behind(&fresh, &fresh.group()).await.is_empty() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "after 60 s: {shipped} of {n} shipped, behind {:?}",
                behind(&fresh, &fresh.group()).await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.store(true, Ordering::SeqCst);
        a.await.unwrap();
        b.await.unwrap();
        let shipped = orders.shipped().await;
        assert_eq!(shipped.len(), n);
        assert!(
            shipped.iter().all(|(_, rows)| *rows == 1),
            "an order shipped twice: {shipped:?}"
        );
        let (by_first, by_second) = (first.load(Ordering::SeqCst), second.load(Ordering::SeqCst));
        assert!(
            by_first >= 40 && by_second > 0 && by_first + by_second >= n,
            "both consumers worked: {by_first} + {by_second} for {n} messages"
        );
    })
    .await;
}

/// The outbox's Kafka publisher: every row arrives keyed by its business key, with its message
/// id in a header, in order per key (one partition per key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_publishes_every_row_keyed_in_order_with_its_id() {
    use idem::outbox::kafka::{ID_HEADER, KafkaPublisher};
    use idem::outbox::{Outbox, Relay};
    on_fresh_topics("idem_kafka_outbox", |fresh| async move {
        let dir = tempfile::tempdir().unwrap();
        let store = idem::SqliteStore::open(dir.path().join("outbox.db"))
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let outbox = Outbox::new();
        outbox.migrate(store.pool()).await.unwrap();
        let (keys, per_key) = (4, 5);
        let mut tx = store.begin().await.unwrap();
        for n in 1..=per_key {
            for k in 0..keys {
                let payload = format!("K{k}#{n}");
                outbox
                    .enqueue(&mut tx, &fresh.name, &format!("K{k}"), payload.as_bytes())
                    .await
                    .unwrap();
            }
        }
        tx.commit().await.unwrap();
        let publisher = KafkaPublisher::connect(&brokers()).unwrap();
        let relay = Relay::builder(store.pool(), publisher)
            .outbox(&outbox)
            .build()
            .unwrap();
        for _ in 0..200 {
            if relay.pending().await.unwrap() == 0 {
                break;
            }
            relay.run_once().await.unwrap();
        }
        assert_eq!(relay.pending().await.unwrap(), 0, "every row sent");

        let consumer = fresh.consumer(&server::unique("reader"));
        let mut messages = consumer.stream();
        let mut got: Vec<(String, String, String, i32)> = Vec::new();
        while got.len() < (keys * per_key) as usize {
            let message = tokio::time::timeout(Duration::from_secs(30), messages.next())
                .await
                .expect("every row within 30 s")
                .unwrap()
                .unwrap();
            got.push((
                String::from_utf8_lossy(message.key().unwrap()).into_owned(),
                String::from_utf8_lossy(message.payload().unwrap()).into_owned(),
                header(&message, ID_HEADER),
                message.partition(),
            ));
        }
        for k in 0..keys {
            let key = format!("K{k}");
            let of_key: Vec<&(String, String, String, i32)> =
                got.iter().filter(|(m, ..)| *m == key).collect();
            let payloads: Vec<&str> = of_key.iter().map(|(_, p, ..)| p.as_str()).collect();
            let expected: Vec<String> = (1..=per_key).map(|n| format!("{key}#{n}")).collect();
            assert_eq!(payloads, expected, "{key} in order");
            assert!(
                of_key.iter().all(|m| m.3 == of_key[0].3),
                "{key}: one partition"
            );
        }
        let mut ids: Vec<&str> = got.iter().map(|(_, _, id, _)| id.as_str()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), got.len(), "one distinct id per row");
        assert!(
            ids.iter().all(|id| id.starts_with("idem_outbox:")),
            "{ids:?}"
        );
    })
    .await;
}
