//! A message consumer made idempotent with `#[idempotent]` and `idem::inbox`, on RabbitMQ and on
//! NATS JetStream.
//!
//! Brokers deliver at least once: a consumer that dies after its side effect but before its ack
//! gets the message again, a producer that retries publishes the same order twice (under a new
//! message id), and a handler that fails asks for a redelivery. Every delivery goes through
//! [`Shipping::handle`]: `Inbox::handle_json` decodes the payload and runs
//! `#[idempotent(biz = "ORDER", key = "msg.order_no", tx = "tx", fingerprint = "msg")]`, keyed by
//! the order number in the payload, never the broker's message id (which changes when a producer
//! resends); the claim and the side effect (a row in `orders_shipped`) commit in one SQLite
//! transaction before the ack. There is no verdict or outcome mapping here: the inbox says what
//! to tell the broker, and the library settles it, `idem::inbox::amqp::settle` on a quorum queue
//! declared by `amqp::declare_queue` (with its `<queue>.dead` dead-letter queue) and
//! `idem::inbox::jetstream::settle` with dead letters copied to a subject that a second stream
//! keeps. A first delivery or a duplicate is acked, a failure is requeued after a back-off, and an
//! unreadable payload, a blank order number or another payload under a shipped one is
//! dead-lettered.
//!
//! ```text
//! cargo run -p idem-suite --all-features --example mq_consumer -- rabbitmq   # IDEM_AMQP_URL, default amqp://guest:guest@127.0.0.1:5672/%2f
//! cargo run -p idem-suite --all-features --example mq_consumer -- nats       # IDEM_NATS_URL, default nats://127.0.0.1:4222
//! ```
//!
//! The demo publishes six messages for three orders (each order twice, under distinct message
//! ids), makes the warehouse fail once for one order, "kills" the first consumer right after it
//! shipped another order but before its ack, lets a second consumer drain the queue, prints every
//! delivery and the `orders_shipped` table, and deletes its queues (streams); it exits with 1
//! unless there is one row per order. `tests/mq_rabbitmq.rs` and `tests/mq_nats.rs` drive the
//! same functions and assert it. The RabbitMQ half needs the feature `rabbitmq`, the NATS half
//! `nats`.

// Built without a broker's feature, its half of the demo is left out.
#![cfg_attr(not(all(feature = "rabbitmq", feature = "nats")), allow(unused))]

use std::collections::HashSet;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use idem::inbox::{Handled, Inbox, Verdict};
use idem::metrics::Outcome;
use idem::sqlx;
use idem::{IdemError, SqliteStore, SqliteTx, idempotent};
use serde::{Deserialize, Serialize};

/// Errors of the broker plumbing.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `IDEM_AMQP_URL`, or the local RabbitMQ as guest.
pub fn amqp_url() -> String {
    std::env::var("IDEM_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// `IDEM_NATS_URL`, or the local NATS server.
pub fn nats_url() -> String {
    std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// An order event as published (JSON). The same order published twice carries the same
/// `order_no`, the idempotency key, whatever message id the broker sees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderMsg {
    pub order_no: String,
    pub sku: String,
    pub qty: u32,
}

/// What shipping an order produced: stored by idem with the claim, replayed to duplicates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shipment {
    pub order_no: String,
    /// The `orders_shipped` row of the one real execution.
    pub shipment_id: i64,
}

/// Why shipping an order failed.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    /// The (simulated) warehouse call failed; a redelivery may succeed.
    #[error("warehouse unavailable for {0}")]
    Warehouse(String),
    /// idem refused (`PayloadMismatch`, `InvalidKey`) or its store failed (also the commit).
    #[error(transparent)]
    Idem(#[from] IdemError),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// The consumer's business: ships each order once, into the `orders_shipped` table of the SQLite
/// file that also holds idem's records (so claim and shipment commit together).
pub struct Shipping {
    store: SqliteStore,
    inbox: Inbox,
    /// Orders whose next warehouse call fails (then succeeds).
    flaky: Mutex<HashSet<String>>,
}

impl Shipping {
    /// Opens (or creates) the SQLite file, runs idem's migrations and creates `orders_shipped`
    /// (no unique constraint: only idem keeps it free of duplicates).
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, IdemError> {
        let store = SqliteStore::open(path).await?;
        store.migrate().await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS orders_shipped (id INTEGER PRIMARY KEY, \
             order_no TEXT NOT NULL, sku TEXT NOT NULL, qty INTEGER NOT NULL)",
        )
        .execute(store.pool())
        .await
        .map_err(IdemError::store)?;
        // 5 attempts per order, redelivered 100 ms, 200 ms, … after a failure. In transaction
        // mode a failed body rolls its claim back, so the broker's delivery count is what counts.
        let retry_delay = Duration::from_millis(100);
        let inbox = Inbox::builder().retry_delay(retry_delay).build()?;
        let flaky = Mutex::new(HashSet::new());
        Ok(Self {
            store,
            inbox,
            flaky,
        })
    }

    /// Makes the next warehouse call for `order_no` fail, after its row was written (so the
    /// rollback is what keeps the table clean); the one after succeeds.
    pub fn fail_once(&self, order_no: &str) {
        self.flaky.lock().unwrap().insert(order_no.to_owned());
    }

    /// One delivery (`delivered`: the broker's delivery count): decode, ship at most once per
    /// order number in a transaction of its own, commit, and say what to tell the broker.
    pub async fn handle(
        &self,
        payload: &[u8],
        delivered: Option<u32>,
    ) -> Handled<Shipment, ShipError> {
        let ship = |msg: OrderMsg| async move {
            let mut tx = self.store.begin().await?;
            let shipment = self.ship(&mut tx, &msg).await?;
            // Durable before the ack: a failed commit is an error, and the message comes back.
            tx.commit().await?;
            Ok::<_, ShipError>(shipment)
        };
        self.inbox.handle_json(payload, delivered, ship).await
    }

    /// Writes the order's `orders_shipped` row, then calls the warehouse. Runs at most once per
    /// order number; a duplicate gets the first shipment back.
    #[idempotent(biz = "ORDER", key = "msg.order_no", tx = "tx", fingerprint = "msg")]
    async fn ship(&self, tx: &mut SqliteTx, msg: &OrderMsg) -> Result<Shipment, ShipError> {
        let insert = "INSERT INTO orders_shipped (order_no, sku, qty) VALUES (?1, ?2, ?3)";
        let shipment_id = sqlx::query(insert)
            .bind(&msg.order_no)
            .bind(&msg.sku)
            .bind(msg.qty)
            .execute(&mut **tx)
            .await?
            .last_insert_rowid();
        if self.flaky.lock().unwrap().remove(&msg.order_no) {
            return Err(ShipError::Warehouse(msg.order_no.clone()));
        }
        let order_no = msg.order_no.clone();
        Ok(Shipment {
            order_no,
            shipment_id,
        })
    }

    /// The side-effect table: `(order_no, rows)`, sorted by order number.
    pub async fn shipped(&self) -> Result<Vec<(String, i64)>, sqlx::Error> {
        let query = "SELECT order_no, COUNT(*) FROM orders_shipped GROUP BY order_no ORDER BY 1";
        sqlx::query_as(query).fetch_all(self.store.pool()).await
    }
}

/// When a consumer run stops: once `settle` deliveries were acked or dead-lettered (within 30 s),
/// or, simulating a crash, right after `crash_after` was shipped and committed (its first
/// execution), without settling it and letting the connection go, so the broker redelivers.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub settle: usize,
    pub crash_after: Option<String>,
}

impl Plan {
    /// Settle `n` deliveries, no crash.
    pub fn settle(n: usize) -> Self {
        let crash_after = None;
        Self {
            settle: n,
            crash_after,
        }
    }

    /// The same plan, crashing after `order_no` was shipped.
    pub fn crash_after(mut self, order_no: &str) -> Self {
        self.crash_after = Some(order_no.to_owned());
        self
    }
}

/// One delivery as a consumer saw it.
#[derive(Debug)]
pub struct Seen {
    /// The broker's message id (AMQP `message-id`, JetStream `Nats-Msg-Id`): logged, never the key.
    pub message_id: String,
    /// The order number in the payload, when it could be read.
    pub order_no: Option<String>,
    /// AMQP `redelivered`, JetStream delivery count > 1.
    pub redelivered: bool,
    /// What the inbox made of it.
    pub handled: Handled<Shipment, ShipError>,
    /// Whether the consumer "crashed" on it instead of settling it.
    pub crashed: bool,
}

/// Every delivery of one consumer run, in order.
#[derive(Debug, Default)]
pub struct Tally {
    pub seen: Vec<Seen>,
}

impl Tally {
    /// Deliveries the broker will not redeliver (acked or dead-lettered).
    pub fn settled(&self) -> usize {
        let requeue = |s: &Seen| matches!(s.handled.verdict, Verdict::Requeue { .. });
        self.seen
            .iter()
            .filter(|s| !s.crashed && !requeue(s))
            .count()
    }

    /// Whether the run ended in the simulated crash.
    pub fn crashed(&self) -> bool {
        self.seen.last().is_some_and(|s| s.crashed)
    }

    /// Hands one delivery to `shipping` and records it: the verdict to settle, or `None` to crash.
    async fn deliver(
        &mut self,
        shipping: &Shipping,
        plan: &Plan,
        message_id: String,
        redelivered: bool,
        payload: &[u8],
        delivered: Option<u32>,
    ) -> Option<Verdict> {
        let handled = shipping.handle(payload, delivered).await;
        let order_no = serde_json::from_slice(payload)
            .ok()
            .map(|m: OrderMsg| m.order_no);
        let crashed = handled.verdict == Verdict::Ack
            && handled.outcome == Some(Outcome::Executed)
            && order_no.is_some()
            && order_no == plan.crash_after;
        let verdict = (!crashed).then(|| handled.verdict.clone());
        self.seen.push(Seen {
            message_id,
            order_no,
            redelivered,
            handled,
            crashed,
        });
        verdict
    }

    /// Prints the deliveries, one line each.
    pub fn print(&self, title: &str) {
        println!("{title}");
        for s in &self.seen {
            let answer = match &s.handled.verdict {
                _ if s.crashed => "(crashed before ack)".to_owned(),
                Verdict::Ack => "ack".to_owned(),
                Verdict::Requeue { delay } => format!("requeue after {delay:?}"),
                Verdict::DeadLetter { .. } => "dead letter".to_owned(),
            };
            let note = match (&s.handled.verdict, &s.handled.result) {
                (Verdict::DeadLetter { reason }, _) => reason.clone(),
                (_, Some(Ok(shipment))) => format!("shipment {}", shipment.shipment_id),
                (_, Some(Err(e))) => e.to_string(),
                (_, None) => String::new(),
            };
            let order = s.order_no.as_deref().unwrap_or("-");
            let again = if s.redelivered { "redelivered" } else { "" };
            let idem = s.handled.outcome.map_or("-", |o| o.as_str());
            let id = &s.message_id;
            println!("  {id:<10} {order:<8} {again:<11} {idem:<10} {answer:<21} {note}");
        }
    }
}

/// The traffic, as `(message id, JSON payload)`: three orders, each published twice under
/// distinct message ids, as by a producer that retries after a lost publish confirm.
pub fn demo_messages(prefix: &str) -> Vec<(String, Vec<u8>)> {
    let order = |n: u32| OrderMsg {
        order_no: format!("ORD-{n}"),
        sku: format!("SKU-{}", 100 + n),
        qty: n,
    };
    let message = |(i, n)| {
        (
            format!("{prefix}{}", i + 1),
            serde_json::to_vec(&order(n)).unwrap(),
        )
    };
    [1, 2, 1, 3, 2, 3]
        .into_iter()
        .enumerate()
        .map(message)
        .collect()
}

/// The deadline of one consumer run.
fn deadline() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(30)
}

/// The error of a consumer run that did not settle its plan in time.
fn stalled(consumer: &str, tally: &Tally, plan: &Plan) -> BoxError {
    let (settled, want) = (tally.settled(), plan.settle);
    format!("{consumer}: {settled} of {want} deliveries settled after 30 s").into()
}

/// RabbitMQ: a quorum queue with its `<queue>.dead` dead-letter queue, verdicts settled by
/// `amqp::settle`.
#[cfg(feature = "rabbitmq")]
pub mod rabbit {
    use futures_util::StreamExt;
    use idem::inbox::amqp;
    use lapin::options::{BasicQosOptions, ConfirmSelectOptions};
    use lapin::{BasicProperties, Connection, ConnectionProperties};

    use super::{BoxError, Plan, Shipping, Tally, deadline, stalled};

    /// Connects to RabbitMQ (no retries: an unreachable broker fails at once).
    pub async fn connect(url: &str) -> lapin::Result<Connection> {
        Connection::connect(url, ConnectionProperties::default()).await
    }

    /// Declares the quorum queue `queue` and its dead-letter queue `<queue>.dead`.
    pub async fn declare(conn: &Connection, queue: &str) -> lapin::Result<()> {
        amqp::declare_queue(&conn.create_channel().await?, queue).await
    }

    /// Deletes `queue` and its dead-letter queue, with whatever is left in them.
    pub async fn delete(conn: &Connection, queue: &str) -> lapin::Result<()> {
        let channel = conn.create_channel().await?;
        for q in [queue.to_owned(), amqp::dead_letter_queue(queue)] {
            channel
                .queue_delete(q.as_str().into(), Default::default())
                .await?;
        }
        Ok(())
    }

    /// Publishes `(message id, payload)` pairs to `queue` and waits for the broker's confirms.
    pub async fn publish(
        conn: &Connection,
        queue: &str,
        msgs: &[(String, Vec<u8>)],
    ) -> Result<(), BoxError> {
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        for (id, payload) in msgs {
            let props = BasicProperties::default().with_message_id(id.as_str().into());
            let publish =
                channel.basic_publish("".into(), queue.into(), Default::default(), payload, props);
            if !publish.await?.await?.is_ack() {
                return Err(format!("RabbitMQ did not confirm message {id}").into());
            }
        }
        Ok(())
    }

    /// Consumes `queue` on a connection of its own until `plan` says stop, each delivery through
    /// [`Shipping::handle`] and `amqp::settle`. On the planned crash the connection is closed with
    /// the delivery unacked, and RabbitMQ requeues it.
    pub async fn run_consumer(
        url: &str,
        queue: &str,
        shipping: &Shipping,
        plan: &Plan,
    ) -> Result<Tally, BoxError> {
        let conn = connect(url).await?;
        let channel = conn.create_channel().await?;
        // `amqp::settle` waits out a requeue's delay holding the delivery: prefetch more than 1.
        channel.basic_qos(8, BasicQosOptions::default()).await?;
        let tag = "idem-shipping".into(); // manual acks: the default options
        let mut deliveries = channel
            .basic_consume(queue.into(), tag, Default::default(), Default::default())
            .await?;
        let (mut tally, deadline) = (Tally::default(), deadline());
        while tally.settled() < plan.settle {
            let next = tokio::time::timeout_at(deadline, deliveries.next()).await;
            let delivery = next
                .map_err(|_| stalled(queue, &tally, plan))?
                .ok_or_else(|| format!("RabbitMQ cancelled the consumer of {queue}"))??;
            let id = delivery.properties.message_id().as_ref();
            let id = id.map_or_else(String::new, |id| id.as_str().to_owned());
            let (redelivered, count) = (delivery.redelivered, amqp::delivered(&delivery));
            let handled = tally.deliver(shipping, plan, id, redelivered, &delivery.data, count);
            let Some(verdict) = handled.await else {
                // The "kill": no ack; the connection goes as a dead process's would, and the
                // broker requeues every delivery it had not acked.
                conn.close(200, "killed before its ack".into()).await?;
                return Ok(tally);
            };
            amqp::settle(&delivery, &verdict).await?;
        }
        conn.close(200, "done".into()).await?;
        Ok(tally)
    }

    /// The demo on `queue`: declare, publish `msgs`, drain with two consumers, delete the queues.
    pub async fn demo(
        queue: &str,
        msgs: &[(String, Vec<u8>)],
        shipping: &Shipping,
        first: &Plan,
    ) -> Result<(Tally, Tally), BoxError> {
        let url = &super::amqp_url();
        let unreachable = |e| format!("RabbitMQ at {url} is unreachable ({e}); set IDEM_AMQP_URL");
        let conn = connect(url).await.map_err(unreachable)?;
        declare(&conn, queue).await?;
        let runs = async {
            publish(&conn, queue, msgs).await?;
            println!(
                "published {} messages to RabbitMQ queue {queue}\n",
                msgs.len()
            );
            let run1 = run_consumer(url, queue, shipping, first).await?;
            let rest = Plan::settle(msgs.len() - run1.settled());
            Ok((run1, run_consumer(url, queue, shipping, &rest).await?))
        };
        let runs: Result<_, BoxError> = runs.await;
        delete(&conn, queue).await?;
        runs
    }
}

/// NATS JetStream: a work-queue stream with the durable pull consumer [`nats::CONSUMER`] and a
/// second stream keeping the dead-letter subject, verdicts settled by `jetstream::settle`.
#[cfg(feature = "nats")]
pub mod nats {
    use std::time::Duration;

    use async_nats::jetstream::{self, consumer, stream};
    use futures_util::StreamExt;
    use idem::inbox::jetstream as inbox_js;

    use super::{BoxError, Plan, Shipping, Tally, deadline, stalled};

    /// The work stream's durable pull consumer.
    pub const CONSUMER: &str = "shipping";

    /// `(stream, subject)` of the dead letters of the stream `name`.
    pub fn dead_letters(name: &str) -> (String, String) {
        (format!("{name}_dead"), format!("{name}.dead"))
    }

    /// Connects to NATS and opens its JetStream context.
    pub async fn connect(url: &str) -> Result<jetstream::Context, async_nats::ConnectError> {
        Ok(jetstream::new(async_nats::connect(url).await?))
    }

    /// Creates the in-memory work-queue stream `name` on `subject`, its consumer [`CONSUMER`] (a
    /// message not settled within `ack_wait` is redelivered) and the dead-letter stream.
    pub async fn setup(
        js: &jetstream::Context,
        name: &str,
        subject: &str,
        ack_wait: Duration,
    ) -> Result<(), BoxError> {
        let storage = stream::StorageType::Memory;
        let work = js
            .create_stream(stream::Config {
                name: name.to_owned(),
                subjects: vec![subject.to_owned()],
                retention: stream::RetentionPolicy::WorkQueue,
                storage,
                ..Default::default()
            })
            .await?;
        work.create_consumer(consumer::pull::Config {
            durable_name: Some(CONSUMER.to_owned()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait,
            ..Default::default()
        })
        .await?;
        let (name, subject) = dead_letters(name);
        let subjects = vec![subject];
        js.create_stream(stream::Config {
            name,
            subjects,
            storage,
            ..Default::default()
        })
        .await?;
        Ok(())
    }

    /// Deletes the stream `name` (its consumer and messages too) and its dead-letter stream.
    pub async fn delete(js: &jetstream::Context, name: &str) -> Result<(), BoxError> {
        js.delete_stream(name).await?;
        js.delete_stream(dead_letters(name).0).await?;
        Ok(())
    }

    /// Publishes `(message id, payload)` pairs on `subject`, each with its own `Nats-Msg-Id` (the
    /// stream's de-duplication works on that id, so the resent orders get through), and waits
    /// for each publish ack.
    pub async fn publish(
        js: &jetstream::Context,
        subject: &str,
        msgs: &[(String, Vec<u8>)],
    ) -> Result<(), BoxError> {
        for (id, payload) in msgs {
            let msg = jetstream::message::PublishMessage::build().message_id(id);
            let msg = msg.payload(payload.clone().into());
            js.send_publish(subject.to_owned(), msg).await?.await?;
        }
        Ok(())
    }

    /// Consumes [`CONSUMER`] of the stream `name` on a connection of its own until `plan` says
    /// stop, each message through [`Shipping::handle`] and `jetstream::settle` (dead letters to
    /// [`dead_letters`]). On the planned crash the connection is dropped with the message
    /// unacked, and JetStream redelivers it after its `ack_wait`.
    pub async fn run_consumer(
        url: &str,
        name: &str,
        shipping: &Shipping,
        plan: &Plan,
    ) -> Result<Tally, BoxError> {
        let js = connect(url).await?;
        let pull: consumer::PullConsumer =
            js.get_stream(name).await?.get_consumer(CONSUMER).await?;
        let mut messages = pull.messages().await?;
        let (_, dead) = dead_letters(name);
        let (mut tally, deadline) = (Tally::default(), deadline());
        while tally.settled() < plan.settle {
            let next = tokio::time::timeout_at(deadline, messages.next()).await;
            let msg = next
                .map_err(|_| stalled(name, &tally, plan))?
                .ok_or_else(|| format!("JetStream closed the consumer of {name}"))??;
            let id = msg.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id"));
            let id = id.map_or_else(String::new, |id| id.to_string());
            let count = inbox_js::delivered(&msg);
            let redelivered = count.is_some_and(|n| n > 1);
            let handled = tally.deliver(shipping, plan, id, redelivered, &msg.payload, count);
            let Some(verdict) = handled.await else {
                // The "kill": no ack; the connection goes with the message still pending.
                return Ok(tally);
            };
            inbox_js::settle(&msg, &verdict, Some(&dead)).await?;
        }
        Ok(tally)
    }

    /// The demo on the stream `name`: set up, publish `msgs`, drain with two consumers, delete
    /// the streams.
    pub async fn demo(
        name: &str,
        msgs: &[(String, Vec<u8>)],
        shipping: &Shipping,
        first: &Plan,
    ) -> Result<(Tally, Tally), BoxError> {
        let url = &super::nats_url();
        let unreachable = |e| format!("NATS at {url} is unreachable ({e}); set IDEM_NATS_URL");
        let js = connect(url).await.map_err(unreachable)?;
        let subject = format!("{name}.created");
        setup(&js, name, &subject, Duration::from_secs(1)).await?;
        let runs = async {
            publish(&js, &subject, msgs).await?;
            println!(
                "published {} messages to JetStream stream {name}\n",
                msgs.len()
            );
            let run1 = run_consumer(url, name, shipping, first).await?;
            let rest = Plan::settle(msgs.len() - run1.settled());
            Ok((run1, run_consumer(url, name, shipping, &rest).await?))
        };
        let runs: Result<_, BoxError> = runs.await;
        delete(&js, name).await?;
        runs
    }
}

async fn demo(broker: &str) -> Result<(), BoxError> {
    let db = std::env::temp_dir().join(format!("idem-mq-demo-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&db);
    let shipping = Shipping::open(&db).await?;
    let msgs = demo_messages("m-");
    // The warehouse fails once for ORD-3; the first consumer dies after shipping ORD-2.
    shipping.fail_once("ORD-3");
    let first = Plan::settle(msgs.len()).crash_after("ORD-2");
    let name = format!("idem_demo_orders_{}", std::process::id());
    let runs: Result<(Tally, Tally), BoxError> = match broker {
        #[cfg(feature = "rabbitmq")]
        "rabbitmq" => rabbit::demo(&name, &msgs, &shipping, &first).await,
        #[cfg(feature = "nats")]
        "nats" => nats::demo(&name, &msgs, &shipping, &first).await,
        other => Err(format!("{other} is not built in: use --all-features").into()),
    };
    let (run1, run2) = runs?;

    let (id, order, again, idem, answer) = ("message", "order", "", "idem", "answer");
    println!("  {id:<10} {order:<8} {again:<11} {idem:<10} {answer:<21} note");
    run1.print("consumer 1 (crashes after shipping ORD-2, before its ack):");
    run2.print("consumer 2:");
    println!("\norders_shipped (rows per order):");
    let shipped = shipping.shipped().await?;
    for (order_no, rows) in &shipped {
        println!("  {order_no}  {rows}");
    }
    drop(shipping);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    let once = |order: &str| (order.to_owned(), 1);
    if shipped != [once("ORD-1"), once("ORD-2"), once("ORD-3")] {
        return Err(format!("expected one shipment per order, got {shipped:?}").into());
    }
    let deliveries = run1.seen.len() + run2.seen.len();
    println!("\n{deliveries} deliveries, 3 orders, 3 shipments");
    Ok(())
}

#[tokio::main]
async fn main() {
    let broker = std::env::args().nth(1).unwrap_or_default();
    if broker != "rabbitmq" && broker != "nats" {
        eprintln!(
            "usage: cargo run -p idem-suite --all-features --example mq_consumer -- rabbitmq|nats"
        );
        std::process::exit(2);
    }
    if let Err(e) = demo(&broker).await {
        eprintln!("mq_consumer {broker}: {e}");
        std::process::exit(1);
    }
}
