//! Messaging end to end, on real servers: orders created over HTTP by the Idempotency-Key layer
//! in transaction mode, each enqueuing "order created" in the outbox in the same transaction; a
//! relay publishing them; a consumer on `idem::inbox` shipping each order in a transaction of its
//! own. A storm of 2,000 orders with 12 % duplicate requests runs while the relay and the consumer
//! are each killed and restarted at random points (at least 10 times: the task is aborted where it
//! stands and its broker connection dropped with it, as a dead process's would be), plus poison
//! messages sent straight to the broker. Over MariaDB and Postgres, on RabbitMQ and JetStream;
//! over Postgres on Kafka (tansu, a Kafka-compatible broker: the consumer in a consumer group,
//! rejoining it after each kill).
//!
//! The audit is the consumer's own `shipments` table (exactly one row per order), the service's
//! `orders` table (one per order), the outbox (nothing unsent), the broker (nothing left to
//! deliver or unacked) and the dead letters (exactly the poison).

#[path = "support/kafka.rs"]
mod kafka;
#[path = "contract/server.rs"]
mod server;
#[path = "support/tx_orders.rs"]
mod tx_orders;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream as js;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::StreamExt;
use idem::http::{IdempotencyLayer, LayerTx, Principal};
use idem::inbox::kafka::KafkaSettler;
use idem::inbox::{Inbox, amqp, jetstream};
use idem::outbox::{Outbox, OutboxConn, OutboxPool, Publisher, Relay};
use idem::sqlx::{self, AssertSqlSafe};
use idem::{IdemError, MySqlStore, MySqlTx, PgStore, PgTx, TransactionalStore, idempotent};
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::message::Headers;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tx_orders::Orders;

const ORDERS: usize = 2_000;
const DUPLICATES: usize = ORDERS * 12 / 100;
const POISON: usize = 5;
const KILLS: usize = 10;

/// "Order created", as the service enqueues it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OrderCreated {
    order_no: String,
}

#[derive(Debug, thiserror::Error)]
enum ShipError {
    #[error(transparent)]
    Idem(#[from] IdemError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Ships an order once: its row in the consumer's own table, committed with the claim.
macro_rules! shipper {
    ($name:ident, $tx:ty, $p:literal) => {
        #[idempotent(biz = "E2E_SHIP", key = "msg.order_no", tx = "tx")]
        async fn $name(tx: &mut $tx, table: &str, msg: &OrderCreated) -> Result<(), ShipError> {
            let sql = format!("INSERT INTO {table} (order_no) VALUES ({})", $p);
            sqlx::query(AssertSqlSafe(sql))
                .bind(&msg.order_no)
                .execute(&mut **tx)
                .await?;
            Ok(())
        }
    };
}
shipper!(ship_mysql, MySqlTx, "?");
shipper!(ship_pg, PgTx, "$1");

/// The database side of one run: MariaDB or Postgres, with its tables.
#[derive(Clone)]
#[allow(clippy::large_enum_variant)]
enum Db {
    MySql(MySqlStore),
    Pg(PgStore),
}

/// The tables of one run.
#[derive(Clone)]
struct Tables {
    orders: Arc<str>,
    shipments: Arc<str>,
    outbox: Outbox,
}

impl Db {
    async fn mysql() -> Option<Db> {
        let url = server::mysql_url();
        let store = server::reach("MariaDB", &url, MySqlStore::connect(&url)).await?;
        let store = store.with_table(&server::unique("idemt_e2e_rec")).unwrap();
        store.migrate().await.unwrap();
        Some(Db::MySql(store))
    }

    async fn postgres() -> Option<Db> {
        let url = server::pg_url();
        let store = server::reach(
            "Postgres",
            &url,
            PgStore::builder()
                .table(&server::unique("idemt_e2e_rec"))
                .unwrap()
                .connect(&url),
        )
        .await?;
        store.migrate().await.unwrap();
        Some(Db::Pg(store))
    }

    fn pool(&self) -> OutboxPool {
        match self {
            Db::MySql(s) => s.pool().into(),
            Db::Pg(s) => s.pool().into(),
        }
    }

    async fn exec(&self, sql: String) {
        match self {
            Db::MySql(s) => sqlx::query(AssertSqlSafe(sql))
                .execute(s.pool())
                .await
                .map(drop),
            Db::Pg(s) => sqlx::query(AssertSqlSafe(sql))
                .execute(s.pool())
                .await
                .map(drop),
        }
        .unwrap();
    }

    async fn count(&self, sql: String) -> i64 {
        match self {
            Db::MySql(s) => {
                sqlx::query_scalar(AssertSqlSafe(sql))
                    .fetch_one(s.pool())
                    .await
            }
            Db::Pg(s) => {
                sqlx::query_scalar(AssertSqlSafe(sql))
                    .fetch_one(s.pool())
                    .await
            }
        }
        .unwrap()
    }

    async fn setup(&self) -> Tables {
        let tables = Tables {
            orders: server::unique("idemt_e2e_orders").into(),
            shipments: server::unique("idemt_e2e_ship").into(),
            outbox: Outbox::with_table(&server::unique("idemt_e2e_outbox")).unwrap(),
        };
        self.exec(tx_orders::create_table(&tables.orders)).await;
        self.exec(format!(
            "CREATE TABLE {} (order_no VARCHAR(255) NOT NULL)",
            tables.shipments
        ))
        .await;
        tables.outbox.migrate(self.pool()).await.unwrap();
        tables
    }

    async fn teardown(&self, tables: &Tables) {
        for t in [&*tables.orders, &*tables.shipments, tables.outbox.table()] {
            self.exec(format!("DROP TABLE IF EXISTS {t}")).await;
        }
    }

    /// Ships one delivery's order in a transaction of the consumer's own.
    async fn ship(&self, table: &str, msg: OrderCreated) -> Result<(), ShipError> {
        match self {
            Db::MySql(s) => {
                let mut tx = s.begin().await?;
                ship_mysql(&mut tx, table, &msg).await?;
                tx.commit().await?;
            }
            Db::Pg(s) => {
                let mut tx = s.begin().await?;
                ship_pg(&mut tx, table, &msg).await?;
                tx.commit().await?;
            }
        }
        Ok(())
    }
}

#[derive(Clone)]
struct App {
    orders: Arc<str>,
    outbox: Outbox,
    destination: Arc<str>,
}

/// `POST /orders`: the order row and its "order created" message, in the layer's transaction.
async fn create<T: Orders + OutboxConn>(
    State(app): State<App>,
    headers: HeaderMap,
    mut tx: LayerTx<T>,
    body: String,
) -> Response {
    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
    tx.get_mut()
        .insert_order(&app.orders, &key, "e2e")
        .await
        .unwrap();
    app.outbox
        .enqueue(tx.get_mut(), &app.destination, &key, body.as_bytes())
        .await
        .unwrap();
    (StatusCode::CREATED, key).into_response()
}

async fn serve<S>(store: S, app: App) -> String
where
    S: TransactionalStore + Clone,
    S::Tx: idem::TransitionTx + Orders + OutboxConn,
{
    let layer = IdempotencyLayer::builder_tx(store)
        .principal(Principal::unscoped("one caller"))
        .build()
        .unwrap();
    let router = Router::new()
        .route("/orders", post(create::<S::Tx>))
        .with_state(app)
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/orders", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    url
}

/// The broker side of one run.
#[derive(Clone)]
enum Broker {
    Rabbit {
        url: String,
        queue: String,
    },
    Nats {
        url: String,
        stream: String,
    },
    /// Work on `topic` (3 partitions), dead letters on `<topic>.dead`, consumers in `group` (one
    /// of this run's own: a broker that outlives runs keeps a group's members and offsets).
    Kafka {
        brokers: String,
        topic: String,
        group: String,
    },
}

const KAFKA_PARTITIONS: i32 = 3;

/// The distinct messages in Kafka dead-letter topic `dead`, by their origin header: without
/// transactions a dead letter is produced at least once (a consumer killed after producing it and
/// before committing its original produces it again when the original comes back), and the origin
/// (`topic/partition/offset`) tells the copies of one apart from another.
fn kafka_dead_origins(reader: &BaseConsumer, dead: &str) -> u64 {
    let timeout = Duration::from_secs(5);
    let (_, end) = reader.fetch_watermarks(dead, 0, timeout).unwrap();
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(dead, 0, Offset::Beginning)
        .unwrap();
    reader.assign(&list).unwrap();
    let mut origins = std::collections::HashSet::new();
    let mut next = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while next < end {
        assert!(
            std::time::Instant::now() < deadline,
            "the dead letters not read in 10 s"
        );
        let Some(Ok(message)) = reader.poll(Duration::from_millis(100)) else {
            continue;
        };
        next = message.offset() + 1;
        let origin = message
            .headers()
            .and_then(|h| {
                h.iter()
                    .find(|h| h.key == idem::inbox::kafka::ORIGIN_HEADER)
            })
            .and_then(|h| h.value)
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        origins.insert(origin);
    }
    origins.len() as u64
}

impl Broker {
    async fn kafka() -> Option<Broker> {
        let brokers = kafka::brokers();
        let topic = server::unique("idem_e2e");
        let created = kafka::create_with_dead(&brokers, &topic, KAFKA_PARTITIONS);
        server::reach("Kafka", &brokers, created).await?;
        let group = format!("{topic}-shipping");
        Some(Broker::Kafka {
            brokers,
            topic,
            group,
        })
    }

    async fn rabbit() -> Option<Broker> {
        let url = server::amqp_url();
        let conn = server::reach(
            "RabbitMQ",
            &url,
            Connection::connect(&url, ConnectionProperties::default()),
        )
        .await?;
        let queue = server::unique("idem_e2e");
        amqp::declare_queue(&conn.create_channel().await.unwrap(), &queue)
            .await
            .unwrap();
        let _ = conn.close(200, "declared".into()).await;
        Some(Broker::Rabbit { url, queue })
    }

    async fn nats() -> Option<Broker> {
        let url = server::nats_url();
        let client = server::reach("NATS", &url, async_nats::connect(&url)).await?;
        let ctx = js::new(client);
        let stream = server::unique("idem_e2e");
        let work = ctx
            .create_stream(js::stream::Config {
                name: stream.clone(),
                subjects: vec![format!("{stream}.orders")],
                retention: js::stream::RetentionPolicy::WorkQueue,
                storage: js::stream::StorageType::Memory,
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            })
            .await
            .unwrap();
        work.create_consumer(js::consumer::pull::Config {
            durable_name: Some("shipping".to_owned()),
            ack_policy: js::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(2),
            ..Default::default()
        })
        .await
        .unwrap();
        ctx.create_stream(js::stream::Config {
            name: format!("{stream}_DEAD"),
            subjects: vec![format!("{stream}.dead")],
            storage: js::stream::StorageType::Memory,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .unwrap();
        Some(Broker::Nats { url, stream })
    }

    fn destination(&self) -> String {
        match self {
            Broker::Rabbit { queue, .. } => queue.clone(),
            Broker::Nats { stream, .. } => format!("{stream}.orders"),
            Broker::Kafka { topic, .. } => topic.clone(),
        }
    }

    /// A relay "process": its own broker connection and relay, passes until killed.
    fn spawn_relay(&self, db: &Db, outbox: &Outbox, kill: Kill) -> JoinHandle<()> {
        let (broker, pool, outbox) = (self.clone(), db.pool(), outbox.clone());
        tokio::spawn(async move {
            let mut amqp_conn = None;
            let publisher: Arc<dyn Publisher> = match &broker {
                Broker::Rabbit { url, .. } => {
                    let conn = Connection::connect(url, ConnectionProperties::default())
                        .await
                        .unwrap();
                    let channel = conn.create_channel().await.unwrap();
                    amqp_conn = Some(conn);
                    Arc::new(
                        idem::outbox::amqp::AmqpPublisher::new(channel)
                            .await
                            .unwrap(),
                    )
                }
                Broker::Nats { url, .. } => {
                    let client = async_nats::connect(url).await.unwrap();
                    Arc::new(idem::outbox::jetstream::JetStreamPublisher::new(js::new(
                        client,
                    )))
                }
                Broker::Kafka { brokers, .. } => {
                    Arc::new(idem::outbox::kafka::KafkaPublisher::connect(brokers).unwrap())
                }
            };
            let relay = Relay::builder(pool, publisher)
                .outbox(&outbox)
                .batch(200)
                .lease(Duration::from_secs(1))
                .poll(Duration::from_millis(20))
                .retry_delay(Duration::from_millis(20))
                .max_retry_delay(Duration::from_millis(100))
                .build()
                .unwrap();
            let passes = async {
                loop {
                    match relay.run_once().await {
                        Ok(pass) if pass.sent + pass.failed > 0 => {}
                        _ => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            };
            // Killed wherever the pass stands: its future is dropped mid-await, then the
            // connection goes, as a dead process's socket would.
            tokio::select! {
                () = passes => {}
                _ = kill => {}
            }
            if let Some(conn) = amqp_conn {
                let _ = conn.close(320, "killed".into()).await;
            }
        })
    }

    /// A consumer "process": its own connection, each delivery through the inbox, until killed
    /// (its work dropped wherever it stands, then its connection closed, as a dead process's
    /// socket would be: RabbitMQ requeues what it had not acked, JetStream redelivers it after
    /// `ack_wait`).
    fn spawn_consumer(
        &self,
        db: &Db,
        shipments: Arc<str>,
        inbox: Inbox,
        kill: Kill,
    ) -> JoinHandle<()> {
        let (broker, db) = (self.clone(), db.clone());
        tokio::spawn(async move {
            match &broker {
                Broker::Rabbit { url, queue } => {
                    let conn = Connection::connect(url, ConnectionProperties::default())
                        .await
                        .unwrap();
                    let work = async {
                        let channel = conn.create_channel().await.unwrap();
                        channel.basic_qos(32, Default::default()).await.unwrap();
                        let mut deliveries = channel
                            .basic_consume(
                                queue.as_str().into(),
                                "e2e".into(),
                                BasicConsumeOptions::default(),
                                FieldTable::default(),
                            )
                            .await
                            .unwrap();
                        while let Some(Ok(delivery)) = deliveries.next().await {
                            let (db, table) = (db.clone(), shipments.clone());
                            let handled = inbox
                                .handle_json(
                                    &delivery.data,
                                    amqp::delivered(&delivery),
                                    |msg: OrderCreated| async move { db.ship(&table, msg).await },
                                )
                                .await;
                            if amqp::settle(&delivery, &handled.verdict).await.is_err() {
                                return;
                            }
                        }
                    };
                    tokio::select! {
                        () = work => {}
                        _ = kill => {}
                    }
                    let _ = conn.close(320, "killed".into()).await;
                }
                Broker::Nats { url, stream } => {
                    let ctx = js::new(async_nats::connect(url).await.unwrap());
                    let work = async {
                        let consumer: js::consumer::PullConsumer = ctx
                            .get_stream(stream)
                            .await
                            .unwrap()
                            .get_consumer("shipping")
                            .await
                            .unwrap();
                        let mut messages = consumer.messages().await.unwrap();
                        let dead = format!("{stream}.dead");
                        while let Some(Ok(msg)) = messages.next().await {
                            let (db, table) = (db.clone(), shipments.clone());
                            let handled = inbox
                                .handle_json(
                                    &msg.payload,
                                    jetstream::delivered(&msg),
                                    |m: OrderCreated| async move { db.ship(&table, m).await },
                                )
                                .await;
                            if jetstream::settle(&msg, &handled.verdict, Some(&dead))
                                .await
                                .is_err()
                            {
                                return;
                            }
                        }
                    };
                    tokio::select! {
                        () = work => {}
                        _ = kill => {}
                    }
                    drop(ctx);
                }
                Broker::Kafka {
                    brokers,
                    topic,
                    group,
                } => {
                    let consumer: StreamConsumer =
                        kafka::consumer_config(brokers, group).create().unwrap();
                    consumer.subscribe(&[topic]).unwrap();
                    let consumer = Arc::new(consumer);
                    let producer: FutureProducer = ClientConfig::new()
                        .set("bootstrap.servers", brokers)
                        .create()
                        .unwrap();
                    let settler = KafkaSettler::new(Arc::clone(&consumer))
                        .dead_letters(format!("{topic}.dead"), producer);
                    let work = async {
                        let mut messages = consumer.stream();
                        while let Some(message) = messages.next().await {
                            let Ok(message) = message else { continue };
                            let Some(delivered) = settler.admit(&message) else {
                                continue;
                            };
                            let (db, table) = (db.clone(), shipments.clone());
                            let handled = inbox
                                .handle_json(
                                    message.payload().unwrap_or_default(),
                                    Some(delivered),
                                    |m: OrderCreated| async move { db.ship(&table, m).await },
                                )
                                .await;
                            if settler.settle(&message, &handled.verdict).await.is_err() {
                                return;
                            }
                        }
                    };
                    tokio::select! {
                        () = work => {}
                        _ = kill => {}
                    }
                }
            }
        })
    }

    async fn send_poison(&self, n: usize) {
        for i in 0..n {
            let payload = format!("{{\"poison\": {i}");
            match self {
                Broker::Rabbit { url, queue } => {
                    let conn = Connection::connect(url, ConnectionProperties::default())
                        .await
                        .unwrap();
                    let channel = conn.create_channel().await.unwrap();
                    channel
                        .basic_publish(
                            "".into(),
                            queue.as_str().into(),
                            BasicPublishOptions::default(),
                            payload.as_bytes(),
                            BasicProperties::default(),
                        )
                        .await
                        .unwrap();
                    let _ = conn.close(200, "sent".into()).await;
                }
                Broker::Nats { url, stream } => {
                    let ctx = js::new(async_nats::connect(url).await.unwrap());
                    ctx.publish(format!("{stream}.orders"), payload.into_bytes().into())
                        .await
                        .unwrap()
                        .await
                        .unwrap();
                }
                Broker::Kafka { brokers, topic, .. } => {
                    let producer: FutureProducer = ClientConfig::new()
                        .set("bootstrap.servers", brokers)
                        .create()
                        .unwrap();
                    let key = format!("poison-{i}");
                    let record = FutureRecord::to(topic).key(&key).payload(&payload);
                    producer
                        .send(record, Duration::from_secs(10))
                        .await
                        .unwrap();
                }
            }
        }
    }

    /// `(messages not yet settled, dead letters)` as the broker counts them.
    async fn state(&self) -> (u64, u64) {
        match self {
            Broker::Rabbit { url, queue } => {
                let conn = Connection::connect(url, ConnectionProperties::default())
                    .await
                    .unwrap();
                let channel = conn.create_channel().await.unwrap();
                let mut counts = Vec::new();
                for q in [queue.clone(), amqp::dead_letter_queue(queue)] {
                    let mut args = FieldTable::default();
                    args.insert(
                        "x-queue-type".into(),
                        lapin::types::AMQPValue::LongString("quorum".into()),
                    );
                    let declared = channel
                        .queue_declare(
                            q.as_str().into(),
                            QueueDeclareOptions {
                                passive: true,
                                ..QueueDeclareOptions::default()
                            },
                            args,
                        )
                        .await
                        .unwrap();
                    counts.push(u64::from(declared.message_count()));
                }
                let _ = conn.close(200, "inspected".into()).await;
                (counts[0], counts[1])
            }
            Broker::Nats { url, stream } => {
                let ctx = js::new(async_nats::connect(url).await.unwrap());
                let mut consumer: js::consumer::PullConsumer = ctx
                    .get_stream(stream)
                    .await
                    .unwrap()
                    .get_consumer("shipping")
                    .await
                    .unwrap();
                let info = consumer.info().await.unwrap();
                let open = info.num_pending + info.num_ack_pending as u64;
                let mut dead = ctx.get_stream(format!("{stream}_DEAD")).await.unwrap();
                (open, dead.info().await.unwrap().state.messages)
            }
            // Uncommitted: each partition's end less the group's committed offset.
            Broker::Kafka {
                brokers,
                topic,
                group,
            } => {
                let (brokers, topic, group) = (brokers.clone(), topic.clone(), group.clone());
                tokio::task::spawn_blocking(move || {
                    let timeout = Duration::from_secs(5);
                    let reader: BaseConsumer =
                        idem::inbox::kafka::consumer_config(&brokers, &group)
                            .create()
                            .unwrap();
                    let mut list = TopicPartitionList::new();
                    for p in 0..KAFKA_PARTITIONS {
                        list.add_partition(&topic, p);
                    }
                    let committed = reader.committed_offsets(list, timeout).unwrap();
                    let mut open = 0;
                    for p in 0..KAFKA_PARTITIONS {
                        let (_, end) = reader.fetch_watermarks(&topic, p, timeout).unwrap();
                        let at = match committed.find_partition(&topic, p).map(|e| e.offset()) {
                            Some(Offset::Offset(at)) => at,
                            _ => 0,
                        };
                        open += u64::try_from(end - at).unwrap_or(0);
                    }
                    (open, kafka_dead_origins(&reader, &format!("{topic}.dead")))
                })
                .await
                .unwrap()
            }
        }
    }

    async fn teardown(&self) {
        match self {
            Broker::Rabbit { url, queue } => {
                let conn = Connection::connect(url, ConnectionProperties::default())
                    .await
                    .unwrap();
                let channel = conn.create_channel().await.unwrap();
                for q in [queue.clone(), amqp::dead_letter_queue(queue)] {
                    let _ = channel
                        .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                        .await;
                }
                let _ = conn.close(200, "done".into()).await;
            }
            Broker::Nats { url, stream } => {
                let ctx = js::new(async_nats::connect(url).await.unwrap());
                let _ = ctx.delete_stream(stream).await;
                let _ = ctx.delete_stream(format!("{stream}_DEAD")).await;
            }
            Broker::Kafka { brokers, topic, .. } => kafka::delete_with_dead(brokers, topic).await,
        }
    }
}

/// What kills one incarnation of a "process".
type Kill = tokio::sync::oneshot::Receiver<()>;

/// A running incarnation: its kill switch and its task.
type Running = Arc<Mutex<Option<(tokio::sync::oneshot::Sender<()>, JoinHandle<()>)>>>;

fn start(
    spawn: &impl Fn(Kill) -> JoinHandle<()>,
) -> (tokio::sync::oneshot::Sender<()>, JoinHandle<()>) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    (tx, spawn(rx))
}

/// Kills an incarnation and waits until its connection is gone.
async fn kill(running: &Running) {
    let taken = running.lock().unwrap().take();
    if let Some((switch, task)) = taken {
        let _ = switch.send(());
        let _ = task.await;
    }
}

/// Kills and restarts a "process" `KILLS` times at random points, then lets it run.
fn killer(
    spawn: impl Fn(Kill) -> JoinHandle<()> + Send + Sync + 'static,
) -> (JoinHandle<usize>, Running) {
    let current: Running = Arc::new(Mutex::new(Some(start(&spawn))));
    let slot = current.clone();
    let task = tokio::spawn(async move {
        let mut kills = 0;
        while kills < KILLS {
            tokio::time::sleep(Duration::from_millis(fastrand::u64(150..450))).await;
            kill(&slot).await;
            kills += 1;
            tokio::time::sleep(Duration::from_millis(fastrand::u64(0..100))).await;
            *slot.lock().unwrap() = Some(start(&spawn));
        }
        kills
    });
    (task, current)
}

async fn storm(db: Db, broker: Broker) {
    let tables = db.setup().await;
    let app = App {
        orders: tables.orders.clone(),
        outbox: tables.outbox.clone(),
        destination: broker.destination().into(),
    };
    let url = match &db {
        Db::MySql(s) => serve(s.clone(), app).await,
        Db::Pg(s) => serve(s.clone(), app).await,
    };
    let inbox = Inbox::builder()
        .max_attempts(5)
        .busy_delay(Duration::from_millis(50))
        .retry_delay(Duration::from_millis(20))
        .max_retry_delay(Duration::from_millis(200))
        .build()
        .unwrap();
    let (relay_kills, relay) = {
        let (broker, db, outbox) = (broker.clone(), db.clone(), tables.outbox.clone());
        killer(move |kill| broker.spawn_relay(&db, &outbox, kill))
    };
    let (consumer_kills, consumer) = {
        let (broker, db, shipments) = (broker.clone(), db.clone(), tables.shipments.clone());
        killer(move |kill| broker.spawn_consumer(&db, shipments.clone(), inbox.clone(), kill))
    };
    broker.send_poison(POISON).await;

    // The storm: every order once, 12 % of them again, 16 clients at a time.
    let prefix = server::unique("E2E");
    let mut requests: Vec<String> = (0..ORDERS).map(|i| format!("{prefix}-{i}")).collect();
    for _ in 0..DUPLICATES {
        let again = requests[fastrand::usize(..ORDERS)].clone();
        requests.push(again);
    }
    fastrand::shuffle(&mut requests);
    let queue = Arc::new(Mutex::new(requests));
    let client = reqwest::Client::new();
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let (queue, client, url) = (queue.clone(), client.clone(), url.clone());
            tokio::spawn(async move {
                loop {
                    let Some(order_no) = queue.lock().unwrap().pop() else {
                        return;
                    };
                    let body = serde_json::to_string(&OrderCreated {
                        order_no: order_no.clone(),
                    })
                    .unwrap();
                    let reply = client
                        .post(&url)
                        .header("idempotency-key", &order_no)
                        .body(body)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(
                        reply.status().as_u16(),
                        201,
                        "{order_no}: {:?}",
                        reply.text().await
                    );
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(relay_kills.await.unwrap(), KILLS);
    assert_eq!(consumer_kills.await.unwrap(), KILLS);

    // Bounded wait for everything to settle.
    // Unsent rows counted in the outbox table itself, not through the relay.
    let unsent_sql = format!(
        "SELECT COUNT(*) FROM {} WHERE sent_at IS NULL",
        tables.outbox.table()
    );
    let shipped_sql = format!("SELECT COUNT(DISTINCT order_no) FROM {}", tables.shipments);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let shipped = db.count(shipped_sql.clone()).await;
        let unsent = db.count(unsent_sql.clone()).await;
        let (open, dead) = broker.state().await;
        if shipped == ORDERS as i64 && unsent == 0 && open == 0 && dead == POISON as u64 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not settled after 120 s: shipped {shipped}/{ORDERS}, unsent {unsent}, open {open}, dead {dead}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    kill(&relay).await;
    kill(&consumer).await;
    // Once the consumer is gone, nothing it held comes back: every message was settled.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (open, dead) = broker.state().await;
    assert_eq!(
        (open, dead),
        (0, POISON as u64),
        "nothing left, and exactly the poison dead"
    );
    let rows = |table: &str, col: &str| {
        format!(
            "SELECT COUNT(*) FROM (SELECT {col} FROM {table} GROUP BY {col} HAVING COUNT(*) > 1) d"
        )
    };
    assert_eq!(
        db.count(rows(&tables.shipments, "order_no")).await,
        0,
        "no order shipped twice"
    );
    assert_eq!(
        db.count(format!("SELECT COUNT(*) FROM {}", tables.shipments))
            .await,
        ORDERS as i64
    );
    assert_eq!(
        db.count(rows(&tables.orders, "k")).await,
        0,
        "no order created twice"
    );
    assert_eq!(
        db.count(format!("SELECT COUNT(*) FROM {}", tables.orders))
            .await,
        ORDERS as i64
    );
    assert_eq!(
        db.count(format!("SELECT COUNT(*) FROM {}", tables.outbox.table()))
            .await,
        ORDERS as i64,
        "one message per order"
    );
    db.teardown(&tables).await;
    broker.teardown().await;
}

async fn run(db: Option<Db>, broker: Option<Broker>) {
    if let (Some(db), Some(broker)) = (db, broker) {
        storm(db, broker).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_and_rabbitmq_ship_each_order_once_through_kills() {
    run(Db::mysql().await, Broker::rabbit().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_and_jetstream_ship_each_order_once_through_kills() {
    run(Db::mysql().await, Broker::nats().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_and_rabbitmq_ship_each_order_once_through_kills() {
    run(Db::postgres().await, Broker::rabbit().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_and_jetstream_ship_each_order_once_through_kills() {
    run(Db::postgres().await, Broker::nats().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_and_kafka_ship_each_order_once_through_kills() {
    run(Db::postgres().await, Broker::kafka().await).await;
}
