//! The business of the inbox tests (`inbox_rabbitmq.rs`, `inbox_nats.rs`): orders shipped by an
//! `#[idempotent]` lease-mode fn keyed by the order number in the payload, an SQLite side-effect
//! table the assertions read (not idem's counters), and one traffic mix: duplicates under other
//! message ids, an order that fails once, one that always fails, and a payload that is no order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use idem::inbox::BatchMessage;
use idem::inbox::{Handled, Inbox, Verdict};
use idem::metrics::Outcome;
use idem::sqlx::{self, SqlitePool};
use idem::{Call, IdemError, MemoryStore, idempotent};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

/// An order event as published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderMsg {
    /// The business number: the idempotency key.
    pub order_no: String,
    /// How many.
    pub qty: u32,
}

/// Why shipping failed.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    /// The (simulated) warehouse refused; a redelivery may succeed.
    #[error("warehouse down for {0}")]
    Warehouse(String),
    /// idem refused.
    #[error(transparent)]
    Idem(#[from] IdemError),
    /// The side-effect table.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// The shipping service: its side-effect tables, and the faults a test plants.
pub struct Orders {
    db: SqlitePool,
    failures: Mutex<HashMap<String, u32>>,
    parked: Mutex<HashMap<String, Arc<Notify>>>,
}

/// The inbox every test uses: 3 attempts, short delays.
pub fn inbox() -> Inbox {
    Inbox::builder()
        .max_attempts(3)
        .busy_delay(Duration::from_millis(100))
        .retry_delay(Duration::from_millis(50))
        .max_retry_delay(Duration::from_millis(200))
        .build()
        .unwrap()
}

impl Orders {
    /// A fresh service on an in-memory SQLite database; registers idem's store `inbox` once.
    pub async fn new() -> Arc<Self> {
        static STORE: Once = Once::new();
        STORE.call_once(|| idem::register_store("inbox", MemoryStore::new()));
        let db = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        for ddl in [
            "CREATE TABLE attempts (order_no TEXT NOT NULL)",
            "CREATE TABLE shipped (order_no TEXT NOT NULL, qty INTEGER NOT NULL)",
        ] {
            sqlx::query(ddl).execute(&db).await.unwrap();
        }
        Arc::new(Orders {
            db,
            failures: Mutex::new(HashMap::new()),
            parked: Mutex::new(HashMap::new()),
        })
    }

    /// `order_no`'s next `times` attempts fail with a business error.
    pub fn fail(&self, order_no: &str, times: u32) {
        self.failures
            .lock()
            .unwrap()
            .insert(order_no.to_owned(), times);
    }

    /// `order_no`'s next attempt waits for the returned notify before it ships.
    pub fn park(&self, order_no: &str) -> Arc<Notify> {
        let notify = Arc::new(Notify::new());
        self.parked
            .lock()
            .unwrap()
            .insert(order_no.to_owned(), notify.clone());
        notify
    }

    /// Ships an order: one `attempts` row per run of the body, one `shipped` row on success.
    #[idempotent(
        biz = "INBOX",
        key = "msg.order_no",
        store = "inbox",
        fingerprint = "msg"
    )]
    pub async fn ship(&self, msg: &OrderMsg) -> Result<u32, ShipError> {
        self.ship_once(msg).await
    }

    /// The call [`Orders::ship`] makes, for a batch: the same business type, key and fingerprint.
    pub fn ship_call(msg: &OrderMsg) -> Call {
        Call::new("INBOX", &msg.order_no).fingerprint(msg)
    }

    /// The business of [`Orders::ship`], without its claim.
    pub async fn ship_once(&self, msg: &OrderMsg) -> Result<u32, ShipError> {
        sqlx::query("INSERT INTO attempts (order_no) VALUES (?1)")
            .bind(&msg.order_no)
            .execute(&self.db)
            .await?;
        let parked = self.parked.lock().unwrap().remove(&msg.order_no);
        if let Some(notify) = parked {
            notify.notified().await;
        }
        let fail = {
            let mut failures = self.failures.lock().unwrap();
            match failures.get_mut(&msg.order_no) {
                Some(left) if *left > 0 => {
                    *left -= 1;
                    true
                }
                _ => false,
            }
        };
        if fail {
            return Err(ShipError::Warehouse(msg.order_no.clone()));
        }
        sqlx::query("INSERT INTO shipped (order_no, qty) VALUES (?1, ?2)")
            .bind(&msg.order_no)
            .bind(msg.qty)
            .execute(&self.db)
            .await?;
        Ok(msg.qty)
    }

    /// Runs of the body for `order_no`.
    pub async fn attempts(&self, order_no: &str) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM attempts WHERE order_no = ?1")
            .bind(order_no)
            .fetch_one(&self.db)
            .await
            .unwrap()
    }

    /// `(order_no, shipped rows)`, sorted.
    pub async fn shipped(&self) -> Vec<(String, i64)> {
        sqlx::query_as("SELECT order_no, COUNT(*) FROM shipped GROUP BY order_no ORDER BY order_no")
            .fetch_all(&self.db)
            .await
            .unwrap()
    }

    /// One delivery through the inbox.
    pub async fn handle(
        self: &Arc<Self>,
        inbox: &Inbox,
        payload: &[u8],
        delivered: Option<u32>,
    ) -> Handled<u32, ShipError> {
        let orders = self.clone();
        inbox
            .handle_json(payload, delivered, |msg: OrderMsg| async move {
                orders.ship(&msg).await
            })
            .await
    }
}

impl Orders {
    /// The deliveries of one broker batch (payload, delivery count) through
    /// `Inbox::handle_batch`, on the store `ship` uses: one verdict per delivery, in order; a
    /// payload that is no order is answered as unreadable.
    pub async fn handle_batch(
        self: &Arc<Self>,
        inbox: &Inbox,
        deliveries: &[(&[u8], Option<u32>)],
    ) -> Vec<Handled<u32, ShipError>> {
        let mut handled: Vec<Option<Handled<u32, ShipError>>> = Vec::new();
        let mut batch = Vec::new();
        let mut at = Vec::new();
        for (i, (payload, delivered)) in deliveries.iter().enumerate() {
            match serde_json::from_slice::<OrderMsg>(payload) {
                Ok(msg) => {
                    at.push(i);
                    batch.push(BatchMessage::new(Orders::ship_call(&msg), *delivered, msg));
                    handled.push(None);
                }
                Err(e) => handled.push(Some(inbox.unreadable(*delivered, &e))),
            }
        }
        let store = idem::store("inbox").unwrap();
        let done = inbox
            .handle_batch(&*store, batch, |msg: OrderMsg| {
                let orders = self.clone();
                async move { orders.ship_once(&msg).await }
            })
            .await;
        for (i, h) in at.into_iter().zip(done) {
            handled[i] = Some(h);
        }
        handled
            .into_iter()
            .map(|h| h.expect("every delivery handled"))
            .collect()
    }
}

/// The mixed traffic, as `(message id, payload)`: `<p>-A`, `<p>-B`, `<p>-C` and `<p>-FLAKY` (which
/// [`plant`] makes fail once) each published twice under distinct message ids, `<p>-BAD` (which
/// always fails) once, and one payload that is no order.
pub fn traffic(prefix: &str) -> Vec<(String, Vec<u8>)> {
    let order = |name: &str| {
        serde_json::to_vec(&OrderMsg {
            order_no: format!("{prefix}-{name}"),
            qty: 2,
        })
        .unwrap()
    };
    let mut msgs = Vec::new();
    for name in ["A", "B", "C", "FLAKY"] {
        msgs.push((format!("{prefix}-{name}-m1"), order(name)));
    }
    msgs.push((format!("{prefix}-BAD-m1"), order("BAD")));
    msgs.push((format!("{prefix}-POISON-m1"), b"{\"order_no\": 17".to_vec()));
    for name in ["A", "B", "C", "FLAKY"] {
        msgs.push((format!("{prefix}-{name}-m2"), order(name)));
    }
    msgs
}

/// The faults [`traffic`] expects: `<p>-FLAKY` fails once, `<p>-BAD` every time.
pub fn plant(orders: &Orders, prefix: &str) {
    orders.fail(&format!("{prefix}-FLAKY"), 1);
    orders.fail(&format!("{prefix}-BAD"), u32::MAX);
}

/// What one consumer saw: `(message id, outcome, verdict)` per delivery.
#[derive(Debug, Default)]
pub struct Seen(pub Vec<(String, Option<Outcome>, Verdict)>);

impl Seen {
    /// Deliveries of the messages about `order_no` (ids `<order_no>-m<n>`).
    pub fn of(&self, order_no: &str) -> Vec<&(String, Option<Outcome>, Verdict)> {
        let prefix = format!("{order_no}-m");
        self.0
            .iter()
            .filter(|(m, ..)| m.starts_with(&prefix))
            .collect()
    }
}

/// The end state [`traffic`] must reach: each good order shipped once (the audit table), the
/// always-failing one attempted exactly `max_attempts` times and dead-lettered, the poison
/// dead-lettered at its first delivery without a call, duplicates acked as replays.
pub async fn assert_settled(orders: &Orders, prefix: &str, seen: &Seen) {
    let p = |name: &str| format!("{prefix}-{name}");
    assert_eq!(
        orders.shipped().await,
        ["A", "B", "C", "FLAKY"].map(|n| (p(n), 1)).to_vec(),
        "each good order shipped exactly once; deliveries: {seen:#?}"
    );
    assert_eq!(
        orders.attempts(&p("BAD")).await,
        3,
        "BAD ran max_attempts times"
    );
    assert_eq!(
        orders.attempts(&p("FLAKY")).await,
        2,
        "FLAKY failed once, then shipped"
    );
    let bad = seen.of(&p("BAD"));
    assert!(
        matches!(bad.last(), Some((_, Some(Outcome::Failed), Verdict::DeadLetter { reason })) if reason.starts_with("failed 3 times")),
        "BAD's last delivery is a dead letter after 3 failures: {bad:?}"
    );
    assert!(
        bad[..bad.len() - 1]
            .iter()
            .all(|(_, outcome, verdict)| *outcome == Some(Outcome::Failed)
                && matches!(verdict, Verdict::Requeue { .. })),
        "BAD's earlier deliveries were requeued: {bad:?}"
    );
    let poison = seen.of(&p("POISON"));
    assert!(
        matches!(poison.as_slice(), [(_, None, Verdict::DeadLetter { reason })] if reason.starts_with("unreadable payload")),
        "the poison is dead-lettered at its first delivery: {poison:?}"
    );
    for name in ["A", "B", "C"] {
        let acks: Vec<_> = seen
            .of(&p(name))
            .into_iter()
            .map(|(_, outcome, verdict)| (*outcome, verdict.clone()))
            .collect();
        assert_eq!(
            acks,
            [
                (Some(Outcome::Executed), Verdict::Ack),
                (Some(Outcome::Replayed), Verdict::Ack)
            ],
            "{name}: shipped, then its duplicate (another message id) acked as a replay"
        );
    }
}

/// Another caller's delivery of `order_no` holding its claim, its body parked: gives the payload of
/// a duplicate to publish and a task that releases the holder after 300 ms and waits for it.
pub async fn held_in_progress(
    orders: &Arc<Orders>,
    order_no: &str,
) -> (Vec<u8>, tokio::task::JoinHandle<()>) {
    let release = orders.park(order_no);
    let msg = OrderMsg {
        order_no: order_no.to_owned(),
        qty: 1,
    };
    let holder = {
        let (orders, msg) = (orders.clone(), msg.clone());
        tokio::spawn(async move { orders.ship(&msg).await.unwrap() })
    };
    while orders.attempts(order_no).await == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let releaser = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        release.notify_one();
        holder.await.unwrap();
    });
    (serde_json::to_vec(&msg).unwrap(), releaser)
}

/// The duplicate of a held order was requeued with the busy delay while the holder ran, then
/// acked as a replay; the order shipped once, by the holder.
pub async fn assert_requeued_while_busy_then_replayed(
    orders: &Orders,
    order_no: &str,
    seen: &Seen,
) {
    let (last, earlier) = seen.0.split_last().unwrap();
    assert!(
        !earlier.is_empty(),
        "the duplicate was requeued while in progress"
    );
    for (_, outcome, verdict) in earlier {
        assert_eq!(*outcome, Some(Outcome::InProgress));
        assert_eq!(
            *verdict,
            Verdict::Requeue {
                delay: Duration::from_millis(100)
            }
        );
    }
    assert_eq!((last.1, &last.2), (Some(Outcome::Replayed), &Verdict::Ack));
    assert_eq!(orders.shipped().await, [(order_no.to_owned(), 1)]);
    assert_eq!(orders.attempts(order_no).await, 1);
}
