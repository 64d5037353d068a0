//! A message consumer made idempotent with one attribute, on RabbitMQ and on NATS JetStream.
//!
//! Brokers deliver at least once: a consumer that dies after its side effect but before its ack
//! gets the message again, a producer that retries publishes the same order twice (under a new
//! message id), and a handler that fails asks for a redelivery. Here every delivery goes through
//! [`Shipping::handle`], whose business function carries
//! `#[idempotent(biz = "ORDER", key = "msg.order_no", tx = "tx")]`: the key is the order number in
//! the payload, never the broker's message id (which changes when a producer resends), and the
//! claim and the side effect (a row in `orders_shipped`) commit in one SQLite transaction. The
//! handler's [`Verdict`] maps to the broker: a first delivery or a duplicate is acked, a failure is
//! requeued (AMQP `basic.nack` with requeue, JetStream `Nak`) and runs again, a payload that cannot
//! be read is dropped (`basic.reject` without requeue, JetStream `Term`).
//!
//! ```text
//! cargo run -p idem-suite --example mq_consumer -- rabbitmq   # IDEM_AMQP_URL, default amqp://guest:guest@127.0.0.1:5672/%2f
//! cargo run -p idem-suite --example mq_consumer -- nats       # IDEM_NATS_URL, default nats://127.0.0.1:4222
//! ```
//!
//! The demo publishes six messages for three orders (each order twice, under distinct message
//! ids), makes the warehouse fail once for one order, "kills" the first consumer right after it
//! shipped another order but before its ack, lets a second consumer drain the queue, and prints
//! every delivery and the `orders_shipped` table: one row per order. `tests/mq_rabbitmq.rs` and
//! `tests/mq_nats.rs` drive the same functions and assert it.

use std::collections::HashSet;
use std::error::Error;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::PullConsumer};
use futures_util::StreamExt;
use idem::sqlx;
use idem::{IdemError, Outcome, SqliteStore, SqliteTx, idempotent};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde::{Deserialize, Serialize};

/// Errors of the broker plumbing (connecting, declaring, publishing, consuming).
pub type BoxError = Box<dyn Error + Send + Sync>;

/// The RabbitMQ URL: `IDEM_AMQP_URL`, or the local broker as guest.
pub fn amqp_url() -> String {
    std::env::var("IDEM_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// The NATS URL: `IDEM_NATS_URL`, or the local server.
pub fn nats_url() -> String {
    std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// An order event as the producer publishes it (JSON). `order_no` is the business number: the same
/// order published twice carries the same one, whatever message id the broker sees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderMsg {
    /// The business number, the idempotency key.
    pub order_no: String,
    /// What to ship.
    pub sku: String,
    /// How many.
    pub qty: u32,
}

/// What shipping an order produced. Stored by idem with the claim and replayed to duplicates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shipment {
    /// The order shipped.
    pub order_no: String,
    /// The `orders_shipped` row written by the one real execution.
    pub shipment_id: i64,
}

/// Why shipping an order failed.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    /// The (simulated) warehouse call failed; a redelivery may succeed.
    #[error("warehouse unavailable for {0}")]
    Warehouse(String),
    /// idem refused or its store failed (for example `PayloadMismatch`: another payload under an
    /// order number already shipped).
    #[error(transparent)]
    Idem(#[from] IdemError),
    /// The side-effect write failed.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// What the consumer tells the broker about one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Done (executed now, or a duplicate of an order already shipped): remove the message.
    Ack,
    /// Failed for now: put the message back for a redelivery (AMQP nack + requeue, JetStream Nak).
    Requeue,
    /// Can never succeed (unreadable payload, an order number idem refuses as a key, another
    /// payload under a shipped order number): drop it without redelivery (AMQP reject without
    /// requeue, JetStream Term).
    Reject,
}

/// The handler's account of one delivery.
#[derive(Debug, Clone)]
pub struct Handled {
    /// The order number from the payload, when it could be read.
    pub order_no: Option<String>,
    /// What idem did (`executed`, `replayed`, `failed`, …), when the call was made.
    pub outcome: Option<Outcome>,
    /// What to tell the broker.
    pub verdict: Verdict,
    /// A one-line reason, for logs.
    pub note: String,
}

/// The consumer's business: ships each order once, into the `orders_shipped` table of an SQLite
/// file that also holds idem's records (so claim and shipment commit together).
pub struct Shipping {
    store: SqliteStore,
    /// Orders whose next warehouse call fails (then succeeds): the failure-then-redelivery case.
    flaky: Mutex<HashSet<String>>,
}

impl Shipping {
    /// Opens (or creates) the SQLite file, runs idem's migrations and creates `orders_shipped`
    /// (no unique constraint: only idem keeps it free of duplicates).
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, IdemError> {
        let store = SqliteStore::open(path).await?;
        store.migrate().await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS orders_shipped (id INTEGER PRIMARY KEY, order_no TEXT NOT NULL, \
             sku TEXT NOT NULL, qty INTEGER NOT NULL)",
        )
        .execute(store.pool())
        .await
        .map_err(IdemError::store)?;
        Ok(Self {
            store,
            flaky: Mutex::new(HashSet::new()),
        })
    }

    /// Makes the next warehouse call for `order_no` fail (after its row was written, so the
    /// rollback is what keeps the table clean); the one after succeeds.
    pub fn fail_once(&self, order_no: &str) {
        self.flaky
            .lock()
            .expect("flaky set")
            .insert(order_no.to_owned());
    }

    /// Handles one delivery's payload in its own transaction: decode, ship at most once per order
    /// number, commit, and say what to tell the broker. Never panics on a bad message.
    pub async fn handle(&self, payload: &[u8]) -> Handled {
        let msg: OrderMsg = match serde_json::from_slice(payload) {
            Ok(msg) => msg,
            Err(e) => {
                return Handled {
                    order_no: None,
                    outcome: None,
                    verdict: Verdict::Reject,
                    note: format!("unreadable payload: {e}"),
                };
            }
        };
        let order_no = Some(msg.order_no.clone());
        let mut tx = match self.store.begin().await {
            Ok(tx) => tx,
            Err(e) => {
                return Handled {
                    order_no,
                    outcome: None,
                    verdict: Verdict::Requeue,
                    note: format!("cannot begin: {e}"),
                };
            }
        };
        let (res, report) = idem::observe(self.ship(&mut tx, &msg)).await;
        let outcome = report.map(|r| r.outcome);
        let (verdict, note) = match res {
            // Executed or replayed: the shipment (and the claim) must be durable before the ack.
            Ok(shipment) => match tx.commit().await {
                Ok(()) => (Verdict::Ack, format!("shipment {}", shipment.shipment_id)),
                Err(e) => (Verdict::Requeue, format!("commit failed: {e}")),
            },
            Err(e) => {
                // The body's error already rolled back to the claim's savepoint; end the
                // transaction (dropping it rolls back too, this just says so).
                let _ = tx.rollback().await;
                match e {
                    // The message itself is wrong: no redelivery can fix it.
                    ShipError::Idem(IdemError::PayloadMismatch) => (
                        Verdict::Reject,
                        "another payload under a shipped order number".to_owned(),
                    ),
                    ShipError::Idem(e @ IdemError::InvalidKey { .. }) => {
                        (Verdict::Reject, e.to_string())
                    }
                    // The warehouse, or the store (busy, unavailable, misconfigured): keep the
                    // message and try again.
                    other => (Verdict::Requeue, other.to_string()),
                }
            }
        };
        Handled {
            order_no,
            outcome,
            verdict,
            note,
        }
    }

    /// Ships one order: writes its `orders_shipped` row, then calls the (simulated) warehouse.
    /// Runs at most once per order number; a duplicate gets the first shipment back.
    #[idempotent(biz = "ORDER", key = "msg.order_no", tx = "tx", fingerprint = "msg")]
    async fn ship(&self, tx: &mut SqliteTx, msg: &OrderMsg) -> Result<Shipment, ShipError> {
        let shipment_id =
            sqlx::query("INSERT INTO orders_shipped (order_no, sku, qty) VALUES (?1, ?2, ?3)")
                .bind(&msg.order_no)
                .bind(&msg.sku)
                .bind(msg.qty)
                .execute(&mut **tx)
                .await?
                .last_insert_rowid();
        if self.flaky.lock().expect("flaky set").remove(&msg.order_no) {
            return Err(ShipError::Warehouse(msg.order_no.clone()));
        }
        Ok(Shipment {
            order_no: msg.order_no.clone(),
            shipment_id,
        })
    }

    /// The side-effect table: `(order_no, rows)` per order, sorted by order number.
    pub async fn shipped(&self) -> Result<Vec<(String, i64)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT order_no, COUNT(*) FROM orders_shipped GROUP BY order_no ORDER BY order_no",
        )
        .fetch_all(self.store.pool())
        .await
    }
}

/// When a consumer run stops.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Stop after this many deliveries were settled (acked or rejected).
    pub settle: usize,
    /// Simulates a crash: right after this order was shipped and committed (its first execution),
    /// stop without acking and let the connection go (RabbitMQ: closed; NATS: dropped), so the
    /// broker redelivers.
    pub crash_after: Option<String>,
    /// Fail when the run has not finished by then.
    pub timeout: Duration,
}

impl Plan {
    /// Settle `n` deliveries within 30 s, no crash.
    pub fn settle(n: usize) -> Self {
        Self {
            settle: n,
            crash_after: None,
            timeout: Duration::from_secs(30),
        }
    }

    /// The same plan, crashing after `order_no` was shipped.
    pub fn crash_after(mut self, order_no: &str) -> Self {
        self.crash_after = Some(order_no.to_owned());
        self
    }
}

/// One delivery as the consumer saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The broker's message id (AMQP `message-id`, JetStream `Nats-Msg-Id`): logged, never the key.
    pub message_id: String,
    /// The broker's redelivery flag (AMQP `redelivered`, JetStream delivery count > 1).
    pub redelivered: bool,
    /// What the handler did.
    pub handled: Handled,
    /// Whether the consumer "crashed" on this delivery instead of answering the broker.
    pub crashed: bool,
}

/// What one consumer run did.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Every delivery, in order.
    pub seen: Vec<Seen>,
    /// Deliveries acked.
    pub acked: usize,
    /// Deliveries requeued.
    pub requeued: usize,
    /// Deliveries rejected (dropped).
    pub rejected: usize,
    /// Whether the run ended in the simulated crash.
    pub crashed: bool,
}

impl Tally {
    /// Deliveries the broker will not redeliver (acked or rejected).
    pub fn settled(&self) -> usize {
        self.acked + self.rejected
    }

    /// Records a delivery; says whether the run must now crash (stop without answering).
    fn record(
        &mut self,
        message_id: String,
        redelivered: bool,
        handled: Handled,
        plan: &Plan,
    ) -> bool {
        let crash = handled.verdict == Verdict::Ack
            && handled.outcome == Some(Outcome::Executed)
            && handled.order_no.is_some()
            && handled.order_no == plan.crash_after;
        self.seen.push(Seen {
            message_id,
            redelivered,
            handled,
            crashed: crash,
        });
        crash
    }

    fn count(&mut self, verdict: Verdict) {
        match verdict {
            Verdict::Ack => self.acked += 1,
            Verdict::Requeue => self.requeued += 1,
            Verdict::Reject => self.rejected += 1,
        }
    }
}

/// Prints a run's deliveries, one line each.
pub fn print_tally(title: &str, tally: &Tally) {
    println!("{title}");
    for s in &tally.seen {
        let answer = if s.crashed {
            "(crashed before ack)".to_owned()
        } else {
            format!("{:?}", s.handled.verdict)
        };
        println!(
            "  {:<10} {:<8} {:<11} {:<10} {:<21} {}",
            s.message_id,
            s.handled.order_no.as_deref().unwrap_or("-"),
            if s.redelivered { "redelivered" } else { "" },
            s.handled.outcome.map_or("-", |o| o.as_str()),
            answer,
            s.handled.note
        );
    }
}

// ---------------------------------------------------------------------------------------------
// RabbitMQ

/// Connects to RabbitMQ at `url` (no retries: an unreachable broker fails at once).
pub async fn rabbit_connect(url: &str) -> lapin::Result<Connection> {
    Connection::connect(url, ConnectionProperties::default()).await
}

/// Declares the durable work queue `queue`. It deletes itself after 10 minutes without consumers
/// (`x-expires`), so an interrupted test leaves nothing behind for long.
pub async fn rabbit_declare(conn: &Connection, queue: &str) -> lapin::Result<()> {
    let channel = conn.create_channel().await?;
    let mut args = FieldTable::default();
    args.insert("x-expires".into(), AMQPValue::LongUInt(600_000));
    channel
        .queue_declare(queue.into(), QueueDeclareOptions::durable(), args)
        .await?;
    channel.close(200, "declared".into()).await
}

/// Publishes `(message_id, order)` pairs to `queue` (default exchange) and waits for the broker's
/// confirms, so every message is in the queue when this returns.
pub async fn rabbit_publish(
    conn: &Connection,
    queue: &str,
    msgs: &[(String, OrderMsg)],
) -> Result<(), BoxError> {
    let channel = conn.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    for (id, msg) in msgs {
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &serde_json::to_vec(msg)?,
                BasicProperties::default()
                    .with_message_id(id.as_str().into())
                    .with_content_type("application/json".into()),
            )
            .await?
            .await?;
        if !confirm.is_ack() {
            return Err(format!("RabbitMQ did not confirm message {id}: {confirm:?}").into());
        }
    }
    channel.close(200, "published".into()).await?;
    Ok(())
}

/// `(ready messages, consumers)` of `queue`, from a passive declare. Unacked deliveries of a closed
/// channel are back among the ready ones, so `(0, 0)` means every message was acked or rejected.
pub async fn rabbit_queue_state(conn: &Connection, queue: &str) -> lapin::Result<(u32, u32)> {
    let channel = conn.create_channel().await?;
    let q = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions::default().passive(),
            FieldTable::default(),
        )
        .await?;
    channel.close(200, "inspected".into()).await?;
    Ok((q.message_count(), q.consumer_count()))
}

/// Deletes `queue` and whatever is left in it.
pub async fn rabbit_delete(conn: &Connection, queue: &str) -> lapin::Result<()> {
    let channel = conn.create_channel().await?;
    channel
        .queue_delete(queue.into(), QueueDeleteOptions::default())
        .await?;
    channel.close(200, "deleted".into()).await
}

/// Consumes `queue` on a connection of its own until `plan` says stop: each delivery goes through
/// [`Shipping::handle`] and is acked, nacked with requeue or rejected accordingly. On the planned
/// crash the connection is closed with the delivery unacked, and RabbitMQ requeues it.
pub async fn run_rabbit_consumer(
    url: &str,
    queue: &str,
    shipping: &Shipping,
    plan: &Plan,
) -> Result<Tally, BoxError> {
    let conn = rabbit_connect(url).await?;
    let channel = conn.create_channel().await?;
    channel.basic_qos(8, BasicQosOptions::default()).await?;
    let tag = format!("idem-shipping-{}", std::process::id());
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(), // manual acks
            FieldTable::default(),
        )
        .await?;
    let mut tally = Tally::default();
    let deadline = tokio::time::Instant::now() + plan.timeout;
    while tally.settled() < plan.settle {
        let delivery = match tokio::time::timeout_at(deadline, consumer.next()).await {
            Err(_) => {
                return Err(format!(
                    "RabbitMQ queue {queue}: {} of {} deliveries settled after {:?}",
                    tally.settled(),
                    plan.settle,
                    plan.timeout
                )
                .into());
            }
            Ok(None) => return Err(format!("RabbitMQ cancelled the consumer of {queue}").into()),
            Ok(Some(delivery)) => delivery?,
        };
        let message_id = delivery
            .properties
            .message_id()
            .as_ref()
            .map_or_else(|| "-".to_owned(), |id| id.as_str().to_owned());
        let handled = shipping.handle(&delivery.data).await;
        let verdict = handled.verdict;
        if tally.record(message_id, delivery.redelivered, handled, plan) {
            // The "kill": no ack and no cancel; the connection goes away as a dead process's
            // would, and the broker requeues every delivery it had not acked. (Closing it here,
            // rather than dropping the consumer first, keeps the consumer registered until the
            // channel dies, so "no consumers left" tells a test that the requeue happened.)
            tally.crashed = true;
            conn.close(200, "consumer killed before its ack".into())
                .await?;
            return Ok(tally);
        }
        match verdict {
            Verdict::Ack => delivery.ack(BasicAckOptions::default()).await?,
            Verdict::Requeue => {
                delivery
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..BasicNackOptions::default()
                    })
                    .await?
            }
            Verdict::Reject => {
                delivery
                    .reject(BasicRejectOptions { requeue: false })
                    .await?
            }
        };
        tally.count(verdict);
    }
    conn.close(200, "done".into()).await?;
    Ok(tally)
}

// ---------------------------------------------------------------------------------------------
// NATS JetStream

/// Connects to NATS at `url` and opens its JetStream context.
pub async fn nats_connect(url: &str) -> Result<jetstream::Context, async_nats::ConnectError> {
    Ok(jetstream::new(async_nats::connect(url).await?))
}

/// Creates the work-queue stream `stream` on `subject` (in memory) and its durable pull consumer
/// `consumer` with explicit acks: a message neither acked nor nacked within `ack_wait` is
/// redelivered.
pub async fn nats_setup(
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
    consumer: &str,
    ack_wait: Duration,
) -> Result<(), BoxError> {
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: stream.to_owned(),
            subjects: vec![subject.to_owned()],
            retention: jetstream::stream::RetentionPolicy::WorkQueue,
            storage: jetstream::stream::StorageType::Memory,
            ..Default::default()
        })
        .await?;
    stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some(consumer.to_owned()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait,
            ..Default::default()
        })
        .await?;
    Ok(())
}

/// Publishes `(message_id, order)` pairs on `subject`, each with its own `Nats-Msg-Id` (so the
/// stream's own de-duplication, which works on that id, lets the resent orders through, as it does
/// for a producer that resends under a new id), and waits for each publish ack.
pub async fn nats_publish(
    js: &jetstream::Context,
    subject: &str,
    msgs: &[(String, OrderMsg)],
) -> Result<(), BoxError> {
    for (id, msg) in msgs {
        js.send_publish(
            subject.to_owned(),
            jetstream::message::PublishMessage::build()
                .message_id(id)
                .payload(serde_json::to_vec(msg)?.into()),
        )
        .await?
        .await?;
    }
    Ok(())
}

/// `(pending, ack pending)` of the consumer: messages not yet delivered, and delivered but not yet
/// acked. `(0, 0)` means every message was acked (or terminated).
pub async fn nats_consumer_state(
    js: &jetstream::Context,
    stream: &str,
    consumer: &str,
) -> Result<(u64, usize), BoxError> {
    let consumer: PullConsumer = js.get_stream(stream).await?.get_consumer(consumer).await?;
    let info = consumer.get_info().await?;
    Ok((info.num_pending, info.num_ack_pending))
}

/// Deletes `stream` with its consumers and messages.
pub async fn nats_delete(js: &jetstream::Context, stream: &str) -> Result<(), BoxError> {
    js.delete_stream(stream).await?;
    Ok(())
}

/// Consumes the durable pull consumer `consumer` of `stream` on a connection of its own until
/// `plan` says stop: each message goes through [`Shipping::handle`] and is acked (waiting for the
/// server's confirmation), nacked (`AckKind::Nak`, redelivered at once) or terminated. On the
/// planned crash the connection is dropped with the message unacked, and JetStream redelivers it
/// when its `ack_wait` runs out.
pub async fn run_nats_consumer(
    url: &str,
    stream: &str,
    consumer: &str,
    shipping: &Shipping,
    plan: &Plan,
) -> Result<Tally, BoxError> {
    let js = nats_connect(url).await?;
    let pull: PullConsumer = js.get_stream(stream).await?.get_consumer(consumer).await?;
    let mut messages = pull.messages().await?;
    let mut tally = Tally::default();
    let deadline = tokio::time::Instant::now() + plan.timeout;
    while tally.settled() < plan.settle {
        let msg = match tokio::time::timeout_at(deadline, messages.next()).await {
            Err(_) => {
                return Err(format!(
                    "JetStream consumer {stream}/{consumer}: {} of {} deliveries settled after {:?}",
                    tally.settled(),
                    plan.settle,
                    plan.timeout
                )
                .into());
            }
            Ok(None) => return Err(format!("JetStream closed consumer {stream}/{consumer}").into()),
            Ok(Some(msg)) => msg?,
        };
        let message_id = msg
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Msg-Id"))
            .map_or_else(|| "-".to_owned(), |id| id.to_string());
        let redelivered = msg.info()?.delivered > 1;
        let handled = shipping.handle(&msg.payload).await;
        let verdict = handled.verdict;
        if tally.record(message_id, redelivered, handled, plan) {
            // The "kill": no ack; the connection goes away with the message still pending.
            tally.crashed = true;
            drop(messages);
            drop(js);
            return Ok(tally);
        }
        match verdict {
            Verdict::Ack => msg.double_ack().await?,
            Verdict::Requeue => msg.double_ack_with(AckKind::Nak(None)).await?,
            Verdict::Reject => msg.double_ack_with(AckKind::Term).await?,
        }
        tally.count(verdict);
    }
    Ok(tally)
}

// ---------------------------------------------------------------------------------------------
// The demo

/// The demo's (and the tests') traffic: three orders, each published twice under distinct message
/// ids, as a producer that retries after a lost publish confirm would.
pub fn demo_messages(prefix: &str) -> Vec<(String, OrderMsg)> {
    let order = |n: u32| OrderMsg {
        order_no: format!("ORD-{n}"),
        sku: format!("SKU-{}", 100 + n),
        qty: n,
    };
    [1, 2, 1, 3, 2, 3]
        .into_iter()
        .enumerate()
        .map(|(i, n)| (format!("{prefix}{}", i + 1), order(n)))
        .collect()
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

    let (run1, run2) = match broker {
        "rabbitmq" => {
            let url = amqp_url();
            let conn = rabbit_connect(&url).await.map_err(|e| {
                format!("RabbitMQ at {url} is unreachable ({e}); set IDEM_AMQP_URL")
            })?;
            rabbit_declare(&conn, &name).await?;
            rabbit_publish(&conn, &name, &msgs).await?;
            println!(
                "published {} messages to RabbitMQ queue {name}\n",
                msgs.len()
            );
            let result = async {
                let run1 = run_rabbit_consumer(&url, &name, &shipping, &first).await?;
                let rest = Plan::settle(msgs.len() - run1.settled());
                let run2 = run_rabbit_consumer(&url, &name, &shipping, &rest).await?;
                Ok::<_, BoxError>((run1, run2))
            }
            .await;
            rabbit_delete(&conn, &name).await?;
            result?
        }
        "nats" => {
            let url = nats_url();
            let js = nats_connect(&url)
                .await
                .map_err(|e| format!("NATS at {url} is unreachable ({e}); set IDEM_NATS_URL"))?;
            let subject = format!("{name}.created");
            nats_setup(&js, &name, &subject, "shipping", Duration::from_secs(1)).await?;
            let result = async {
                nats_publish(&js, &subject, &msgs).await?;
                println!(
                    "published {} messages to JetStream stream {name}\n",
                    msgs.len()
                );
                let run1 = run_nats_consumer(&url, &name, "shipping", &shipping, &first).await?;
                let rest = Plan::settle(msgs.len() - run1.settled());
                let run2 = run_nats_consumer(&url, &name, "shipping", &shipping, &rest).await?;
                Ok::<_, BoxError>((run1, run2))
            }
            .await;
            nats_delete(&js, &name).await?;
            result?
        }
        other => return Err(format!("unknown broker {other:?}: use rabbitmq or nats").into()),
    };

    println!(
        "  {:<10} {:<8} {:<11} {:<10} {:<21} note",
        "message", "order", "", "idem", "answer"
    );
    print_tally(
        "consumer 1 (crashes after shipping ORD-2, before its ack):",
        &run1,
    );
    print_tally("consumer 2:", &run2);
    println!("\norders_shipped (rows per order):");
    let shipped = shipping.shipped().await?;
    for (order_no, rows) in &shipped {
        println!("  {order_no}  {rows}");
    }
    drop(shipping);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    let want: Vec<(String, i64)> = ["ORD-1", "ORD-2", "ORD-3"]
        .iter()
        .map(|o| ((*o).to_owned(), 1))
        .collect();
    if shipped != want {
        return Err(format!("expected one shipment per order, got {shipped:?}").into());
    }
    println!(
        "\n{} deliveries, 3 orders, 3 shipments",
        run1.seen.len() + run2.seen.len()
    );
    Ok(())
}

#[tokio::main]
async fn main() {
    let broker = std::env::args().nth(1).unwrap_or_default();
    if broker != "rabbitmq" && broker != "nats" {
        eprintln!("usage: cargo run -p idem-suite --example mq_consumer -- rabbitmq|nats");
        std::process::exit(2);
    }
    if let Err(e) = demo(&broker).await {
        eprintln!("mq_consumer {broker}: {e}");
        std::process::exit(1);
    }
}
