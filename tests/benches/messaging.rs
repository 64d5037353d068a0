//! Messages/s through idem's inbox and outbox relay, against the plain client loop, on the local
//! RabbitMQ (`IDEM_AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`), NATS JetStream
//! (`IDEM_NATS_URL`, default `nats://127.0.0.1:4222`) and a Kafka-compatible broker
//! (`IDEM_KAFKA_URL`, default `127.0.0.1:9092`; tansu here).
//!
//! ```text
//! cargo bench -p idem-suite --features rabbitmq,nats,kafka,sqlite --bench messaging
//! IDEM_BENCH_ROUNDS=3 IDEM_BENCH_SCALE=0.2 cargo bench -p idem-suite --features rabbitmq,nats,kafka,sqlite --bench messaging
//! IDEM_BENCH_ONLY=outbox,nats cargo bench …   # workloads by name, side (inbox, outbox), broker (rabbitmq, nats, kafka) or `dup`
//! ```
//!
//! Workloads, each on a fresh queue or stream and a fresh SQLite file per contender and round
//! (deleted after it), `N` = 2,000 messages × `IDEM_BENCH_SCALE`:
//!
//! - `inbox-amqp`, `inbox-nats`: `N` messages with distinct order numbers, pre-filled (a quorum
//!   queue declared by `inbox::amqp::declare_queue`, prefetch 64; a work-queue JetStream stream in
//!   memory with a durable pull consumer), then consumed one at a time. `plain` decodes the JSON,
//!   and in one SQLite transaction writes the order's dedup row (`INSERT OR IGNORE` into a table of
//!   its own keyed by order number) and, when that row is new, the `shipped` row, then acks (AMQP
//!   `basic.ack`; JetStream `double_ack`, the ack `inbox::jetstream::settle` sends). `idem` hands the
//!   payload to `Inbox::handle_json`, whose handler begins a transaction, calls an
//!   `#[idempotent(tx = "tx")]` fn keyed by the order number (claim, insert, mark, in that
//!   transaction) and commits, then settles the verdict with `inbox::amqp::settle` /
//!   `inbox::jetstream::settle`.
//! - `inbox-amqp-dup`, `inbox-nats-dup`: the same with 12 % of the `N` messages duplicates (an order
//!   number already sent, another message id, a few messages later). `idem` acks them as replays
//!   (counted and checked: one row per order); `plain` finds their dedup rows and ships nothing.
//! - `inbox-amqp-batch`, `inbox-nats-batch` (and `…-batch-dup`, 12 % duplicates): the same
//!   traffic taken in batches of up to 64 (what the prefetch of 64 holds; a JetStream `fetch` of 64), each message's
//!   row in an SQLite transaction of its own (begin, insert, commit), then the batch's acks sent
//!   together. `plain` writes the batch's dedup rows in one transaction, then ships each new
//!   order in a transaction of its own. `idem` hands each batch to
//!   `Inbox::handle_batch` (lease mode on the same SQLite file: one batch claim, the row's
//!   transaction as each body, the marks sent together), then settles the verdicts together.
//! - `outbox-amqp`, `outbox-nats`: an SQLite outbox (`Outbox::migrate`) with `N` committed rows
//!   (distinct keys), published to a durable classic queue / a JetStream stream in memory. `idem`
//!   runs `Relay::run_once` (default batch of 100) until all are sent, with `AmqpPublisher` /
//!   `JetStreamPublisher`. `plain` reads the same rows 100 at a time, publishes each with the same
//!   properties (message id, key; persistent and mandatory on RabbitMQ) and awaits its confirm
//!   (RabbitMQ publisher confirm; JetStream publish ack), then marks it sent with an `UPDATE`.
//!
//! - `inbox-kafka`, `inbox-kafka-dup`: the traffic pre-filled in a topic of 3 partitions keyed
//!   by order number, read by a consumer of a group of its own; the clock starts at the first
//!   message (after the group's join). `plain` ships and commits the offset (async); `idem` hands
//!   the payload to `Inbox::handle_json` as above and settles with `inbox::kafka::KafkaSettler`
//!   (the same commit). `outbox-kafka`: the outbox to a topic, `KafkaPublisher` against a plain
//!   loop producing each row (key, id header, idempotent producer), awaiting its acknowledgement,
//!   marking it sent.
//!
//! Each round runs every workload's two contenders, which goes first alternating from round to
//! round (and workload to workload); a warm-up run of each, `N / 5` messages, is not counted. The
//! ratio idem / plain is taken within a round, then the median over rounds (`IDEM_BENCH_ROUNDS`,
//! default 5) is printed, with one `messages/s <contender> <workload> <value>` line per contender
//! (the median of its rounds) and one `ratio idem / plain <workload> <value>` line per workload.
//! A broker that cannot be reached is skipped with one line.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self as js, message::PublishMessage};
use futures_util::FutureExt;
use futures_util::StreamExt;
use idem::inbox::kafka::{self as kafka_inbox, KafkaSettler};
use idem::inbox::{BatchMessage, Inbox, Verdict, amqp as amqp_inbox, jetstream as js_inbox};
use idem::metrics::Outcome;
use idem::outbox::amqp::AmqpPublisher;
use idem::outbox::jetstream::{JetStreamPublisher, KEY_HEADER};
use idem::outbox::kafka::{ID_HEADER, KafkaPublisher};
use idem::outbox::{Outbox, Relay};
use idem::sqlx::{self, SqlitePool};
use idem::{Call, IdemError, SqliteStore, SqliteTx, idempotent};
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::{Deserialize, Serialize};

mod support;
use support::{Table, median, r3, rate};

/// An order event as published (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct OrderMsg {
    order_no: String,
    sku: String,
    qty: u32,
}

#[derive(Debug, thiserror::Error)]
enum ShipError {
    #[error(transparent)]
    Idem(#[from] IdemError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

const SHIPPED_DDL: &str = "CREATE TABLE IF NOT EXISTS shipped (id INTEGER PRIMARY KEY, \
                           order_no TEXT NOT NULL, sku TEXT NOT NULL, qty INTEGER NOT NULL)";
const INSERT: &str = "INSERT INTO shipped (order_no, sku, qty) VALUES (?1, ?2, ?3)";
/// The plain loop's own dedup record: one durable row per order it has handled.
const SEEN_DDL: &str = "CREATE TABLE IF NOT EXISTS plain_seen (order_no TEXT PRIMARY KEY)";
const SEEN: &str = "INSERT OR IGNORE INTO plain_seen (order_no) VALUES (?1)";

/// Ships an order once: its row, with the claim and the mark, in the caller's transaction.
#[idempotent(
    biz = "BENCH_SHIP",
    key = "msg.order_no",
    tx = "tx",
    fingerprint = "msg"
)]
async fn ship(tx: &mut SqliteTx, msg: &OrderMsg) -> Result<i64, ShipError> {
    let id = sqlx::query(INSERT)
        .bind(&msg.order_no)
        .bind(&msg.sku)
        .bind(msg.qty)
        .execute(&mut **tx)
        .await?
        .last_insert_rowid();
    Ok(id)
}

/// idem's handler: a transaction of the consumer's own around the idempotent fn.
async fn ship_idem(store: &SqliteStore, msg: OrderMsg) -> Result<i64, ShipError> {
    let mut tx = store.begin().await?;
    let id = ship(&mut tx, &msg).await?;
    tx.commit().await?;
    Ok(id)
}

/// The plain loop's handler: in one transaction, the order's dedup row and, when that row is
/// new, the shipped row; a duplicate ships nothing. Returns whether it shipped.
async fn ship_plain(pool: &SqlitePool, payload: &[u8]) -> bool {
    let msg: OrderMsg = serde_json::from_slice(payload).expect("an order");
    let mut tx = pool.begin().await.unwrap();
    let new = seen(&mut tx, &msg).await;
    if new {
        sqlx::query(INSERT)
            .bind(&msg.order_no)
            .bind(&msg.sku)
            .bind(msg.qty)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    new
}

/// Writes the order's dedup row; false when it was there already.
async fn seen(tx: &mut sqlx::SqliteConnection, msg: &OrderMsg) -> bool {
    let done = sqlx::query(SEEN)
        .bind(&msg.order_no)
        .execute(&mut *tx)
        .await
        .unwrap();
    done.rows_affected() == 1
}

/// The plain loop's batch: the batch's dedup rows in one transaction, then each new order's row
/// in a transaction of its own (as idem's batch claim, then each body).
async fn ship_plain_batch(pool: &SqlitePool, payloads: &[&[u8]]) {
    let msgs: Vec<OrderMsg> = payloads
        .iter()
        .map(|p| serde_json::from_slice(p).expect("an order"))
        .collect();
    let mut tx = pool.begin().await.unwrap();
    let mut new = Vec::with_capacity(msgs.len());
    for msg in &msgs {
        new.push(seen(&mut tx, msg).await);
    }
    tx.commit().await.unwrap();
    for (msg, new) in msgs.iter().zip(new) {
        if new {
            ship_row(pool, msg).await.unwrap();
        }
    }
}

/// A batch's business: the order's row in a transaction of its own (what the plain loop does),
/// run under the claim `Inbox::handle_batch` made.
async fn ship_row(pool: &SqlitePool, msg: &OrderMsg) -> Result<i64, ShipError> {
    let mut tx = pool.begin().await?;
    let id = sqlx::query(INSERT)
        .bind(&msg.order_no)
        .bind(&msg.sku)
        .bind(msg.qty)
        .execute(&mut *tx)
        .await?
        .last_insert_rowid();
    tx.commit().await?;
    Ok(id)
}

/// The messages of one batch (payload, delivery count) through `Inbox::handle_batch`: one
/// verdict per message, in order.
async fn handle_batch(
    inbox: &Inbox,
    store: &SqliteStore,
    deliveries: &[(&[u8], Option<u32>)],
) -> Vec<idem::inbox::Handled<i64, ShipError>> {
    let batch = deliveries.iter().map(|(payload, delivered)| {
        let msg: OrderMsg = serde_json::from_slice(payload).expect("an order");
        BatchMessage::new(
            Call::new("BENCH_BATCH", &msg.order_no).fingerprint(&msg),
            *delivered,
            msg,
        )
    });
    inbox
        .handle_batch(store, batch, |msg: OrderMsg| async move {
            ship_row(store.pool(), &msg).await
        })
        .await
}

/// One broker batch through `who`: the plain loop ships each message, idem hands the batch to
/// `Inbox::handle_batch`; then every delivery is settled by its verdict (the plain loop's all
/// acked), the settles sent together. `read` gives a delivery's payload and delivery count,
/// `settle` is the adapter's own.
async fn run_batch<'b, D, S, E>(
    who: Who,
    inbox: &Inbox,
    store: &SqliteStore,
    verdicts: &mut Verdicts,
    batch: &'b [D],
    read: impl Fn(&'b D) -> (&'b [u8], Option<u32>),
    settle: impl Fn(&'b D, Verdict) -> S,
) where
    S: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Debug,
{
    let settled: Vec<Verdict> = match who {
        Who::Plain => {
            let payloads: Vec<&[u8]> = batch.iter().map(|d| read(d).0).collect();
            ship_plain_batch(store.pool(), &payloads).await;
            vec![Verdict::Ack; batch.len()]
        }
        Who::Idem => {
            let handed: Vec<(&[u8], Option<u32>)> = batch.iter().map(&read).collect();
            let handled = handle_batch(inbox, store, &handed).await;
            handled
                .into_iter()
                .map(|handled| {
                    verdicts.count(&handled.verdict, handled.outcome);
                    handled.verdict
                })
                .collect()
        }
    };
    let settles = batch.iter().zip(settled).map(|(d, v)| settle(d, v));
    for settled in futures_util::future::join_all(settles).await {
        settled.unwrap();
    }
}

/// The size of one batch: the RabbitMQ prefetch, the JetStream fetch.
const BATCH: usize = 64;

/// A name no other run of this process (or a concurrent one) uses.
fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh SQLite file (idem's settings: WAL, synchronous=NORMAL) with idem's tables, the
/// `shipped` table and the outbox table; removed with the returned directory.
async fn side_db() -> (SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("side.db")).await.unwrap();
    store.migrate().await.unwrap();
    for ddl in [SHIPPED_DDL, SEEN_DDL] {
        sqlx::query(ddl).execute(store.pool()).await.unwrap();
    }
    Outbox::new().migrate(store.pool()).await.unwrap();
    (store, dir)
}

/// `(rows, distinct order numbers)` in `shipped`.
async fn shipped(pool: &SqlitePool) -> (i64, i64) {
    sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT order_no) FROM shipped")
        .fetch_one(pool)
        .await
        .unwrap()
}

fn order(i: usize) -> OrderMsg {
    OrderMsg {
        order_no: format!("ORD-{i:07}"),
        sku: format!("SKU-{}", i % 97),
        qty: 1 + (i % 5) as u32,
    }
}

/// `n` messages `(message id, JSON)`: `n × dup_pct / 100` of them duplicates (an order number
/// sent 10 messages earlier, under another message id), the rest distinct orders. Returns them
/// and the number of distinct orders.
fn traffic(n: usize, dup_pct: usize) -> (Vec<(String, Vec<u8>)>, usize) {
    let dups = n * dup_pct / 100;
    let distinct = n - dups;
    let json = |i: usize| serde_json::to_vec(&order(i)).unwrap();
    // Duplicate k is of order k × distinct / dups, sent after the original of 10 orders later.
    let mut pending: VecDeque<(usize, usize)> = (0..dups)
        .map(|k| {
            let of = k * distinct / dups;
            (of + 10, of)
        })
        .collect();
    let mut msgs = Vec::with_capacity(n);
    for i in 0..distinct {
        msgs.push((format!("ORD-{i:07}-m1"), json(i)));
        while pending.front().is_some_and(|(after, _)| *after <= i) {
            let (_, of) = pending.pop_front().unwrap();
            msgs.push((format!("ORD-{of:07}-m2"), json(of)));
        }
    }
    for (_, of) in pending {
        msgs.push((format!("ORD-{of:07}-m2"), json(of)));
    }
    (msgs, distinct)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Plain,
    Idem,
}

/// One contender's run: messages/s, and (idem's inbox) deliveries acked as replays.
#[derive(Debug, Clone, Copy)]
struct Run {
    rate: f64,
    replays: usize,
}

/// The longest a run may take before the bench gives up on it.
const RUN_LIMIT: Duration = Duration::from_secs(300);
const PREFETCH: u16 = 64;

/// Counts idem's verdicts; panics on anything but an ack (none is expected here).
#[derive(Default)]
struct Verdicts {
    executed: usize,
    replays: usize,
}

impl Verdicts {
    fn count(&mut self, verdict: &Verdict, outcome: Option<Outcome>) {
        assert_eq!(*verdict, Verdict::Ack, "outcome {outcome:?}");
        match outcome {
            Some(Outcome::Executed) => self.executed += 1,
            Some(Outcome::Replayed) => self.replays += 1,
            other => panic!("unexpected outcome {other:?}"),
        }
    }
}

/// Checks the side-effect table after an inbox run: one row per order on both sides (the plain
/// loop keeps its own dedup rows), and idem's verdicts.
async fn check_inbox(pool: &SqlitePool, who: Who, n: usize, distinct: usize, v: &Verdicts) {
    let (rows, orders) = shipped(pool).await;
    assert_eq!(orders as usize, distinct, "every order shipped");
    assert_eq!(rows as usize, distinct, "each order shipped once");
    if who == Who::Idem {
        assert_eq!((v.executed, v.replays), (distinct, n - distinct));
    }
}

async fn inbox_amqp(conn: &Connection, who: Who, n: usize, dup_pct: usize, batched: bool) -> Run {
    let (msgs, distinct) = traffic(n, dup_pct);
    let queue = unique("idem_bench_inbox");
    let channel = conn.create_channel().await.unwrap();
    amqp_inbox::declare_queue(&channel, &queue).await.unwrap();
    // Pre-fill: every publish sent, then every confirm awaited.
    let publisher = conn.create_channel().await.unwrap();
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut confirms = Vec::with_capacity(msgs.len());
    for (id, payload) in &msgs {
        confirms.push(
            publisher
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    payload,
                    BasicProperties::default()
                        .with_message_id(id.as_str().into())
                        .with_delivery_mode(2),
                )
                .await
                .unwrap(),
        );
    }
    for confirm in confirms {
        assert!(confirm.await.unwrap().is_ack());
    }
    let _ = publisher.close(200, "filled".into()).await;
    let (store, dir) = side_db().await;
    let inbox = Inbox::builder().build().unwrap();
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await
        .unwrap();
    let tag = unique("idem-bench");
    let mut verdicts = Verdicts::default();
    let t = Instant::now();
    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut left = n;
    while batched && left > 0 {
        let first = tokio::time::timeout_at((t + RUN_LIMIT).into(), deliveries.next())
            .await
            .expect("the run finishes in time")
            .expect("the consumer was cancelled")
            .unwrap();
        // What the prefetch holds now, up to a batch.
        let mut batch = vec![first];
        while batch.len() < BATCH.min(left) {
            match deliveries.next().now_or_never() {
                Some(Some(delivery)) => batch.push(delivery.unwrap()),
                _ => break,
            }
        }
        left -= batch.len();
        run_batch(
            who,
            &inbox,
            &store,
            &mut verdicts,
            &batch,
            |d| (&d.data[..], amqp_inbox::delivered(d)),
            |d, v| async move { amqp_inbox::settle(d, &v).await },
        )
        .await;
    }
    for _ in 0..if batched { 0 } else { n } {
        let delivery = tokio::time::timeout_at((t + RUN_LIMIT).into(), deliveries.next())
            .await
            .expect("the run finishes in time")
            .expect("the consumer was cancelled")
            .unwrap();
        match who {
            Who::Plain => {
                ship_plain(store.pool(), &delivery.data).await;
                delivery.ack(BasicAckOptions::default()).await.unwrap();
            }
            Who::Idem => {
                let handled = inbox
                    .handle_json(
                        &delivery.data,
                        amqp_inbox::delivered(&delivery),
                        |msg: OrderMsg| ship_idem(&store, msg),
                    )
                    .await;
                amqp_inbox::settle(&delivery, &handled.verdict)
                    .await
                    .unwrap();
                verdicts.count(&handled.verdict, handled.outcome);
            }
        }
    }
    let elapsed = t.elapsed();
    channel
        .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
        .await
        .unwrap();
    check_inbox(store.pool(), who, n, distinct, &verdicts).await;
    for q in [queue.clone(), amqp_inbox::dead_letter_queue(&queue)] {
        channel
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
    let _ = channel.close(200, "done".into()).await;
    store.close().await;
    drop(dir);
    Run {
        rate: n as f64 / elapsed.as_secs_f64(),
        replays: verdicts.replays,
    }
}

async fn inbox_nats(ctx: &js::Context, who: Who, n: usize, dup_pct: usize, batched: bool) -> Run {
    let (msgs, distinct) = traffic(n, dup_pct);
    let name = unique("idem_bench_inbox");
    let subject = format!("{name}.orders");
    let stream = ctx
        .create_stream(js::stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            retention: js::stream::RetentionPolicy::WorkQueue,
            storage: js::stream::StorageType::Memory,
            ..Default::default()
        })
        .await
        .unwrap();
    let consumer: js::consumer::PullConsumer = stream
        .create_consumer(js::consumer::pull::Config {
            durable_name: Some("shipping".to_owned()),
            ack_policy: js::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(60),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut acks = Vec::with_capacity(msgs.len());
    for (id, payload) in &msgs {
        acks.push(
            ctx.send_publish(
                subject.clone(),
                PublishMessage::build()
                    .message_id(id)
                    .payload(payload.clone().into()),
            )
            .await
            .unwrap(),
        );
    }
    for ack in acks {
        ack.await.unwrap();
    }
    let (store, dir) = side_db().await;
    let inbox = Inbox::builder().build().unwrap();
    let mut verdicts = Verdicts::default();
    let t = Instant::now();
    let mut left = n;
    while batched && left > 0 {
        assert!(t.elapsed() < RUN_LIMIT, "the run finishes in time");
        let mut fetched = consumer
            .fetch()
            .max_messages(BATCH)
            .messages()
            .await
            .unwrap();
        let mut batch = Vec::with_capacity(BATCH);
        while let Some(msg) = fetched.next().await {
            batch.push(msg.unwrap());
        }
        left -= batch.len();
        run_batch(
            who,
            &inbox,
            &store,
            &mut verdicts,
            &batch,
            |m| (&m.payload[..], js_inbox::delivered(m)),
            |m, v| async move { js_inbox::settle(m, &v, None).await },
        )
        .await;
    }
    let mut messages = consumer.messages().await.unwrap();
    for _ in 0..if batched { 0 } else { n } {
        let msg = tokio::time::timeout_at((t + RUN_LIMIT).into(), messages.next())
            .await
            .expect("the run finishes in time")
            .expect("the consumer closed")
            .unwrap();
        match who {
            Who::Plain => {
                ship_plain(store.pool(), &msg.payload).await;
                msg.double_ack().await.unwrap();
            }
            Who::Idem => {
                let handled = inbox
                    .handle_json(
                        &msg.payload,
                        js_inbox::delivered(&msg),
                        |order: OrderMsg| ship_idem(&store, order),
                    )
                    .await;
                js_inbox::settle(&msg, &handled.verdict, None)
                    .await
                    .unwrap();
                verdicts.count(&handled.verdict, handled.outcome);
            }
        }
    }
    let elapsed = t.elapsed();
    drop(messages);
    check_inbox(store.pool(), who, n, distinct, &verdicts).await;
    ctx.delete_stream(&name).await.unwrap();
    store.close().await;
    drop(dir);
    Run {
        rate: n as f64 / elapsed.as_secs_f64(),
        replays: verdicts.replays,
    }
}

#[derive(Clone, Copy)]
enum Broker<'a> {
    Amqp(&'a Connection),
    Nats(&'a js::Context),
    /// The bootstrap servers.
    Kafka(&'a str),
}

fn kafka_admin(brokers: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap()
}

async fn kafka_topic(brokers: &str, name: &str) {
    let results = kafka_admin(brokers)
        .create_topics(
            &[NewTopic::new(
                name,
                KAFKA_PARTITIONS,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    for result in results {
        result.unwrap();
    }
}

async fn kafka_delete(brokers: &str, name: &str) {
    let _ = kafka_admin(brokers)
        .delete_topics(&[name], &AdminOptions::new())
        .await;
}

/// The messages in `topic`: the sum of its partitions' ends.
fn kafka_count(brokers: &str, topic: &str) -> i64 {
    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    (0..KAFKA_PARTITIONS)
        .map(|p| {
            reader
                .fetch_watermarks(topic, p, Duration::from_secs(5))
                .unwrap()
                .1
        })
        .sum()
}

const KAFKA_PARTITIONS: i32 = 3;

/// `inbox-kafka`: the traffic pre-filled in a topic of 3 partitions (keyed by order number), read
/// by a consumer of a group of its own (`fetch.wait.max.ms` 50). The clock starts at the first
/// message, after the group's join. `plain` ships and commits each message's offset (async);
/// `idem` admits it, hands it to `Inbox::handle_json` and settles the verdict with
/// `KafkaSettler` (the same async commit).
async fn inbox_kafka(brokers: &str, who: Who, n: usize, dup_pct: usize) -> Run {
    let (msgs, distinct) = traffic(n, dup_pct);
    let topic = unique("idem_bench_inbox");
    kafka_topic(brokers, &topic).await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    let sends = msgs.iter().map(|(_, payload)| {
        let msg: OrderMsg = serde_json::from_slice(payload).unwrap();
        let producer = producer.clone();
        let (topic, payload) = (topic.clone(), payload.clone());
        async move {
            let record = FutureRecord::to(&topic)
                .key(&msg.order_no)
                .payload(&payload);
            producer
                .send(record, Duration::from_secs(30))
                .await
                .unwrap();
        }
    });
    futures_util::future::join_all(sends).await;
    let (store, dir) = side_db().await;
    let inbox = Inbox::builder().build().unwrap();
    let consumer: StreamConsumer = kafka_inbox::consumer_config(brokers, &unique("bench"))
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("fetch.wait.max.ms", "50")
        .create()
        .unwrap();
    consumer.subscribe(&[&topic]).unwrap();
    let consumer = std::sync::Arc::new(consumer);
    let settler = KafkaSettler::new(std::sync::Arc::clone(&consumer));
    let mut messages = consumer.stream();
    let mut verdicts = Verdicts::default();
    let mut t = None;
    let mut handled_n = 0;
    while handled_n < n {
        let message = tokio::time::timeout(RUN_LIMIT, messages.next())
            .await
            .expect("the run finishes in time")
            .expect("the consumer closed")
            .unwrap();
        t.get_or_insert_with(Instant::now);
        let payload = rdkafka::Message::payload(&message).unwrap_or_default();
        match who {
            Who::Plain => {
                ship_plain(store.pool(), payload).await;
                consumer
                    .commit_message(&message, CommitMode::Async)
                    .unwrap();
            }
            Who::Idem => {
                let Some(delivered) = settler.admit(&message) else {
                    continue;
                };
                let handled = inbox
                    .handle_json(payload, Some(delivered), |msg: OrderMsg| {
                        ship_idem(&store, msg)
                    })
                    .await;
                settler.settle(&message, &handled.verdict).await.unwrap();
                verdicts.count(&handled.verdict, handled.outcome);
            }
        }
        handled_n += 1;
    }
    let elapsed = t.expect("a message").elapsed();
    // The consumer leaves before its topic goes: librdkafka crashed (SIGSEGV in its metadata
    // cache) when a topic a live consumer subscribed to was deleted on tansu 0.6.0.
    drop(messages);
    drop(settler);
    drop(consumer);
    check_inbox(store.pool(), who, n, distinct, &verdicts).await;
    kafka_delete(brokers, &topic).await;
    store.close().await;
    drop(dir);
    Run {
        rate: n as f64 / elapsed.as_secs_f64(),
        replays: verdicts.replays,
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

const DUE: &str = "SELECT id, destination, msg_key, payload FROM idem_outbox \
                   WHERE sent_at IS NULL ORDER BY id LIMIT 100";
const MARK: &str = "UPDATE idem_outbox SET sent_at = ?1 WHERE id = ?2";

/// The plain loop of an outbox: reads the due rows 100 at a time and, for each, `publish(message
/// id, destination, key, payload)` (which returns once the broker has it), then marks it sent.
async fn plain_relay(pool: &SqlitePool, mut publish: impl AsyncFnMut(&str, &str, &str, Vec<u8>)) {
    loop {
        let due: Vec<(i64, String, String, Vec<u8>)> =
            sqlx::query_as(DUE).fetch_all(pool).await.unwrap();
        if due.is_empty() {
            return;
        }
        for (id, destination, key, payload) in due {
            let message_id = format!("idem_outbox:{id}");
            publish(&message_id, &destination, &key, payload).await;
            sqlx::query(MARK)
                .bind(now_ms())
                .bind(id)
                .execute(pool)
                .await
                .unwrap();
        }
    }
}

async fn outbox(broker: Broker<'_>, who: Who, n: usize) -> Run {
    let name = unique("idem_bench_outbox");
    let destination = match broker {
        Broker::Amqp(conn) => {
            let channel = conn.create_channel().await.unwrap();
            channel
                .queue_declare(
                    name.as_str().into(),
                    QueueDeclareOptions::durable(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
            let _ = channel.close(200, "declared".into()).await;
            name.clone()
        }
        Broker::Nats(ctx) => {
            ctx.create_stream(js::stream::Config {
                name: name.clone(),
                subjects: vec![format!("{name}.events")],
                storage: js::stream::StorageType::Memory,
                ..Default::default()
            })
            .await
            .unwrap();
            format!("{name}.events")
        }
        Broker::Kafka(brokers) => {
            kafka_topic(brokers, &name).await;
            name.clone()
        }
    };
    let (store, dir) = side_db().await;
    let ob = Outbox::new();
    let mut tx = store.begin().await.unwrap();
    for i in 0..n {
        let msg = order(i);
        let payload = serde_json::to_vec(&msg).unwrap();
        ob.enqueue(&mut tx, &destination, &msg.order_no, &payload)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let pool = store.pool().clone();

    let t;
    match (who, broker) {
        (Who::Idem, _) => {
            let relay = match broker {
                Broker::Amqp(conn) => {
                    let publisher = AmqpPublisher::new(conn.create_channel().await.unwrap())
                        .await
                        .unwrap();
                    Relay::builder(&pool, publisher).build().unwrap()
                }
                Broker::Nats(ctx) => Relay::builder(&pool, JetStreamPublisher::new(ctx.clone()))
                    .build()
                    .unwrap(),
                Broker::Kafka(brokers) => {
                    Relay::builder(&pool, KafkaPublisher::connect(brokers).unwrap())
                        .build()
                        .unwrap()
                }
            };
            t = Instant::now();
            let mut sent = 0;
            while sent < n as u64 {
                let pass = relay.run_once().await.unwrap();
                assert_eq!(pass.failed, 0, "no publish fails");
                assert!(pass.sent > 0, "a pass sends while rows are pending");
                sent += pass.sent;
            }
        }
        (Who::Plain, Broker::Amqp(conn)) => {
            let channel = conn.create_channel().await.unwrap();
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .unwrap();
            t = Instant::now();
            plain_relay(&pool, async |message_id, destination, key, payload| {
                let confirm = channel
                    .basic_publish(
                        "".into(),
                        destination.into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..BasicPublishOptions::default()
                        },
                        &payload,
                        BasicProperties::default()
                            .with_message_id(message_id.into())
                            .with_correlation_id(key.into())
                            .with_delivery_mode(2),
                    )
                    .await
                    .unwrap()
                    .await
                    .unwrap();
                assert!(matches!(confirm, Confirmation::Ack(None)), "{confirm:?}");
            })
            .await;
        }
        (Who::Plain, Broker::Kafka(brokers)) => {
            let producer: FutureProducer = ClientConfig::new()
                .set("bootstrap.servers", brokers)
                .set("enable.idempotence", "true")
                .create()
                .unwrap();
            t = Instant::now();
            plain_relay(&pool, async |message_id, destination, key, payload| {
                let record = FutureRecord::to(destination)
                    .key(key)
                    .payload(&payload)
                    .headers(OwnedHeaders::new().insert(Header {
                        key: ID_HEADER,
                        value: Some(message_id),
                    }));
                producer
                    .send(record, Duration::from_secs(30))
                    .await
                    .unwrap();
            })
            .await;
        }
        (Who::Plain, Broker::Nats(ctx)) => {
            t = Instant::now();
            plain_relay(&pool, async |message_id, destination, key, payload| {
                let publish = PublishMessage::build()
                    .message_id(message_id)
                    .header(KEY_HEADER, key)
                    .payload(payload.into());
                ctx.send_publish(destination.to_owned(), publish)
                    .await
                    .unwrap()
                    .await
                    .unwrap();
            })
            .await;
        }
    }
    let elapsed = t.elapsed();

    let pending: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(pending, 0, "every row marked sent");
    match broker {
        Broker::Amqp(conn) => {
            let channel = conn.create_channel().await.unwrap();
            let queue = channel
                .queue_declare(
                    name.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap();
            assert_eq!(queue.message_count() as usize, n, "every row in the queue");
            channel
                .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                .await
                .unwrap();
            let _ = channel.close(200, "done".into()).await;
        }
        Broker::Nats(ctx) => {
            let info = ctx
                .get_stream(&name)
                .await
                .unwrap()
                .get_info()
                .await
                .unwrap();
            assert_eq!(info.state.messages as usize, n, "every row in the stream");
            ctx.delete_stream(&name).await.unwrap();
        }
        Broker::Kafka(brokers) => {
            let count = kafka_count(brokers, &name);
            assert_eq!(count as usize, n, "every row in the topic");
            kafka_delete(brokers, &name).await;
        }
    }
    pool.close().await;
    drop(dir);
    Run {
        rate: n as f64 / elapsed.as_secs_f64(),
        replays: 0,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Inbox { dup_pct: usize },
    InboxBatch { dup_pct: usize },
    Outbox,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum On {
    Rabbit,
    Nats,
    Kafka,
}

struct Workload {
    name: &'static str,
    on: On,
    kind: Kind,
}

const WORKLOADS: [Workload; 13] = [
    Workload {
        name: "inbox-amqp",
        on: On::Rabbit,
        kind: Kind::Inbox { dup_pct: 0 },
    },
    Workload {
        name: "inbox-amqp-dup",
        on: On::Rabbit,
        kind: Kind::Inbox { dup_pct: 12 },
    },
    Workload {
        name: "inbox-nats",
        on: On::Nats,
        kind: Kind::Inbox { dup_pct: 0 },
    },
    Workload {
        name: "inbox-nats-dup",
        on: On::Nats,
        kind: Kind::Inbox { dup_pct: 12 },
    },
    Workload {
        name: "inbox-amqp-batch",
        on: On::Rabbit,
        kind: Kind::InboxBatch { dup_pct: 0 },
    },
    Workload {
        name: "inbox-amqp-batch-dup",
        on: On::Rabbit,
        kind: Kind::InboxBatch { dup_pct: 12 },
    },
    Workload {
        name: "inbox-nats-batch",
        on: On::Nats,
        kind: Kind::InboxBatch { dup_pct: 0 },
    },
    Workload {
        name: "inbox-nats-batch-dup",
        on: On::Nats,
        kind: Kind::InboxBatch { dup_pct: 12 },
    },
    Workload {
        name: "outbox-amqp",
        on: On::Rabbit,
        kind: Kind::Outbox,
    },
    Workload {
        name: "outbox-nats",
        on: On::Nats,
        kind: Kind::Outbox,
    },
    Workload {
        name: "inbox-kafka",
        on: On::Kafka,
        kind: Kind::Inbox { dup_pct: 0 },
    },
    Workload {
        name: "inbox-kafka-dup",
        on: On::Kafka,
        kind: Kind::Inbox { dup_pct: 12 },
    },
    Workload {
        name: "outbox-kafka",
        on: On::Kafka,
        kind: Kind::Outbox,
    },
];

impl Workload {
    fn picked(&self, only: &[String]) -> bool {
        if only.is_empty() {
            return true;
        }
        let side = match self.kind {
            Kind::Inbox { .. } | Kind::InboxBatch { .. } => "inbox",
            Kind::Outbox => "outbox",
        };
        let broker = match self.on {
            On::Rabbit => "rabbitmq",
            On::Nats => "nats",
            On::Kafka => "kafka",
        };
        let dup = matches!(self.kind, Kind::Inbox { dup_pct } | Kind::InboxBatch { dup_pct } if dup_pct > 0);
        // Every kind of token given must match: `outbox,nats` is the outbox on NATS.
        let sides: Vec<_> = only
            .iter()
            .filter(|t| ["inbox", "outbox"].contains(&t.as_str()))
            .collect();
        let brokers: Vec<_> = only
            .iter()
            .filter(|t| ["rabbitmq", "nats", "kafka"].contains(&t.as_str()))
            .collect();
        let names: Vec<_> = only
            .iter()
            .filter(|t| WORKLOADS.iter().any(|w| w.name == t.as_str()))
            .collect();
        let want_dup = only.iter().any(|t| t == "dup");
        (names.is_empty() || names.iter().any(|t| t.as_str() == self.name))
            && (sides.is_empty() || sides.iter().any(|t| t.as_str() == side))
            && (brokers.is_empty() || brokers.iter().any(|t| t.as_str() == broker))
            && (!want_dup || dup)
    }

    async fn run(
        &self,
        amqp: Option<&Connection>,
        nats: Option<&js::Context>,
        kafka: Option<&str>,
        who: Who,
        n: usize,
    ) -> Run {
        match (self.kind, self.on) {
            (Kind::Inbox { dup_pct }, On::Kafka) => {
                inbox_kafka(kafka.unwrap(), who, n, dup_pct).await
            }
            (Kind::Outbox, On::Kafka) => outbox(Broker::Kafka(kafka.unwrap()), who, n).await,
            (Kind::InboxBatch { .. }, On::Kafka) => unreachable!("no batch workload on Kafka"),
            (Kind::Inbox { dup_pct }, On::Rabbit) => {
                inbox_amqp(amqp.unwrap(), who, n, dup_pct, false).await
            }
            (Kind::Inbox { dup_pct }, On::Nats) => {
                inbox_nats(nats.unwrap(), who, n, dup_pct, false).await
            }
            (Kind::InboxBatch { dup_pct }, On::Rabbit) => {
                inbox_amqp(amqp.unwrap(), who, n, dup_pct, true).await
            }
            (Kind::InboxBatch { dup_pct }, On::Nats) => {
                inbox_nats(nats.unwrap(), who, n, dup_pct, true).await
            }
            (Kind::Outbox, On::Rabbit) => outbox(Broker::Amqp(amqp.unwrap()), who, n).await,
            (Kind::Outbox, On::Nats) => outbox(Broker::Nats(nats.unwrap()), who, n).await,
        }
    }
}

/// One workload's rounds: `(plain, idem)` per round.
struct Figures {
    rounds: Vec<(Run, Run)>,
}

impl Figures {
    fn plain(&self) -> f64 {
        median(self.rounds.iter().map(|(p, _)| p.rate).collect())
    }

    fn idem(&self) -> f64 {
        median(self.rounds.iter().map(|(_, i)| i.rate).collect())
    }

    fn ratio(&self) -> f64 {
        median(self.rounds.iter().map(|(p, i)| i.rate / p.rate).collect())
    }
}

async fn reach<T, E: std::fmt::Display>(
    service: &str,
    url: &str,
    connect: impl std::future::Future<Output = Result<T, E>>,
) -> Option<T> {
    match tokio::time::timeout(Duration::from_secs(5), connect).await {
        Ok(Ok(value)) => Some(value),
        Ok(Err(e)) => {
            println!("skipped: {service} at {url} is unreachable ({e})");
            None
        }
        Err(_) => {
            println!("skipped: {service} at {url} is unreachable (no answer within 5 s)");
            None
        }
    }
}

async fn bench() {
    let env = |name: &str| std::env::var(name).ok();
    let amqp_url =
        env("IDEM_AMQP_URL").unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let nats_url = env("IDEM_NATS_URL").unwrap_or_else(|| "nats://127.0.0.1:4222".to_owned());
    let kafka_url = env("IDEM_KAFKA_URL").unwrap_or_else(|| "127.0.0.1:9092".to_owned());
    let scale = support::scale();
    let rounds = support::rounds(5);
    let only = support::only();
    let n = ((2_000.0 * scale) as usize).max(50);

    let picked: Vec<&Workload> = WORKLOADS.iter().filter(|w| w.picked(&only)).collect();
    let amqp = if picked.iter().any(|w| w.on == On::Rabbit) {
        reach(
            "RabbitMQ",
            &amqp_url,
            Connection::connect(&amqp_url, ConnectionProperties::default()),
        )
        .await
    } else {
        None
    };
    let nats = if picked.iter().any(|w| w.on == On::Nats) {
        reach("NATS", &nats_url, async_nats::connect(&nats_url))
            .await
            .map(js::new)
    } else {
        None
    };
    let kafka = if picked.iter().any(|w| w.on == On::Kafka) {
        let first = kafka_url.split(',').next().unwrap_or_default().to_owned();
        let reached = async move { tokio::net::TcpStream::connect(first).await.map(drop) };
        reach("Kafka", &kafka_url, reached)
            .await
            .map(|()| kafka_url.as_str())
    } else {
        None
    };
    let workloads: Vec<&Workload> = picked
        .into_iter()
        .filter(|w| match w.on {
            On::Rabbit => amqp.is_some(),
            On::Nats => nats.is_some(),
            On::Kafka => kafka.is_some(),
        })
        .collect();
    if workloads.is_empty() {
        return;
    }
    println!(
        "idem messaging: RabbitMQ {amqp_url}, NATS {nats_url}; {n} messages per contender per round, \
         {rounds} rounds, median of per-round ratios; scale {scale}\n"
    );
    let (amqp, nats) = (amqp.as_ref(), nats.as_ref());

    // Warm-up, not counted: connections, the SQLite code paths, the brokers' queues.
    for w in &workloads {
        for who in [Who::Plain, Who::Idem] {
            w.run(amqp, nats, kafka, who, (n / 5).max(50)).await;
        }
    }

    let mut figures: Vec<Figures> = workloads
        .iter()
        .map(|_| Figures { rounds: Vec::new() })
        .collect();
    for round in 0..rounds {
        for (wi, w) in workloads.iter().enumerate() {
            let plain_first = (round + wi) % 2 == 0;
            let (plain, idem) = if plain_first {
                let p = w.run(amqp, nats, kafka, Who::Plain, n).await;
                (p, w.run(amqp, nats, kafka, Who::Idem, n).await)
            } else {
                let i = w.run(amqp, nats, kafka, Who::Idem, n).await;
                (w.run(amqp, nats, kafka, Who::Plain, n).await, i)
            };
            eprintln!(
                "  round {round} {:<15} plain {:>7.0}  idem {:>7.0} msg/s  ratio {:.3} ({} first)",
                w.name,
                plain.rate,
                idem.rate,
                idem.rate / plain.rate,
                if plain_first { "plain" } else { "idem" }
            );
            figures[wi].rounds.push((plain, idem));
        }
    }

    let mut table = Table::new(
        "messaging",
        &[
            "workload",
            "plain msg/s",
            "idem msg/s",
            "idem / plain",
            "duplicates acked as replays",
        ],
    );
    for (w, f) in workloads.iter().zip(&figures) {
        let dups = match w.kind {
            Kind::Inbox { dup_pct } | Kind::InboxBatch { dup_pct } if dup_pct > 0 => {
                let replays: Vec<String> = f
                    .rounds
                    .iter()
                    .map(|(_, i)| i.replays.to_string())
                    .collect();
                format!("{} of {n} ({})", n * dup_pct / 100, replays.join(", "))
            }
            _ => "–".to_owned(),
        };
        table.row([
            w.name.to_owned(),
            rate(f.plain()),
            rate(f.idem()),
            r3(f.ratio()),
            dups,
        ]);
    }
    table.emit();
    for (w, f) in workloads.iter().zip(&figures) {
        println!("messages/s plain {} {:.0}", w.name, f.plain());
        println!("messages/s idem {} {:.0}", w.name, f.idem());
        println!("ratio idem / plain {} {:.3}", w.name, f.ratio());
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(bench());
}
