//! What the RabbitMQ and NATS consumer tests check alike, on what a consumer run saw and on the
//! `orders_shipped` table (not idem's counters). Used by `tests/mq_rabbitmq.rs` and
//! `tests/mq_nats.rs`, which both include `examples/mq_consumer.rs` as `mq_consumer`.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use idem::inbox::Verdict;
use idem::metrics::Outcome;

use crate::mq_consumer::{OrderMsg, Seen, Shipping, Tally};

/// What `connect` gives within 10 s, or `None` after the one skip line (a panic under
/// `IDEM_REQUIRE_SERVICES=1`).
pub async fn broker<T, E: Display>(
    service: &str,
    url: &str,
    connect: impl Future<Output = Result<T, E>>,
) -> Option<T> {
    crate::server::reach(service, url, async {
        tokio::time::timeout(Duration::from_secs(10), connect)
            .await
            .map_err(|_| "no answer within 10 s".to_owned())?
            .map_err(|e| e.to_string())
    })
    .await
}

/// What a test publishes: `(message id, payload)` pairs for the queue (stream) named.
pub type Traffic = fn(&str) -> Vec<(String, Vec<u8>)>;

/// The demo's three orders (each published twice under distinct message ids).
pub const ORDERS: [&str; 3] = ["ORD-1", "ORD-2", "ORD-3"];

/// A fresh SQLite file for one test (removed with the directory).
pub async fn shipping(dir: &tempfile::TempDir) -> Shipping {
    Shipping::open(dir.path().join("shipping.db"))
        .await
        .expect("SQLite store opens")
}

/// The `orders_shipped` table holding one row for each of `orders`.
pub fn one_row_per_order(orders: &[&str]) -> Vec<(String, i64)> {
    let mut want: Vec<(String, i64)> = orders.iter().map(|o| ((*o).to_owned(), 1)).collect();
    want.sort();
    want
}

/// The deliveries of one order number.
pub fn deliveries_of<'a>(run: &'a Tally, order_no: &str) -> Vec<&'a Seen> {
    run.seen
        .iter()
        .filter(|s| s.order_no.as_deref() == Some(order_no))
        .collect()
}

/// Deliveries of `run` that the consumer settled with `verdict`'s kind.
pub fn settled_as(run: &Tally, verdict: fn(&Verdict) -> bool) -> usize {
    run.seen
        .iter()
        .filter(|s| !s.crashed && verdict(&s.handled.verdict))
        .count()
}

/// The first consumer died right after shipping ORD-2 (committed) and before its ack: the
/// delivery it died on.
pub async fn died_after_shipping_ord2<'a>(run: &'a Tally, shipping: &Shipping) -> &'a Seen {
    assert!(run.crashed(), "consumer 1 never reached ORD-2: {run:#?}");
    let crashed = run.seen.last().unwrap();
    assert_eq!(crashed.order_no.as_deref(), Some("ORD-2"));
    assert_eq!(crashed.handled.outcome, Some(Outcome::Executed));
    assert!(
        shipping
            .shipped()
            .await
            .unwrap()
            .contains(&("ORD-2".to_owned(), 1)),
        "the killed consumer's side effect was committed"
    );
    crashed
}

/// The delivery the dead consumer never acked came back (same message id, marked redelivered)
/// and was acked as a replay: the order was not shipped twice.
pub fn redelivered_as_replay(run: &Tally, crashed: &Seen) {
    let again = run
        .seen
        .iter()
        .find(|s| s.message_id == crashed.message_id)
        .unwrap_or_else(|| panic!("{} was not redelivered: {run:#?}", crashed.message_id));
    assert!(again.redelivered, "{again:?}");
    assert_eq!(again.handled.outcome, Some(Outcome::Replayed), "{again:?}");
    assert_eq!(again.handled.verdict, Verdict::Ack, "{again:?}");
}

/// ORD-3 failed on its first try and was requeued once; its redelivery (same message id) came
/// back, and no delivery of it was dead-lettered.
pub fn failed_then_shipped_once(run: &Tally) {
    let ord3 = deliveries_of(run, "ORD-3");
    let first = ord3.first().expect("ORD-3 delivered");
    assert_eq!(first.handled.outcome, Some(Outcome::Failed), "{first:?}");
    assert!(
        matches!(first.handled.verdict, Verdict::Requeue { .. }),
        "{first:?}"
    );
    let requeued = settled_as(run, |v| matches!(v, Verdict::Requeue { .. }));
    assert_eq!(requeued, 1, "one requeue: {run:#?}");
    assert!(
        run.seen
            .iter()
            .any(|s| s.message_id == first.message_id && s.redelivered),
        "the requeued message {} came back redelivered: {run:#?}",
        first.message_id
    );
    assert!(
        ord3.iter()
            .all(|s| !matches!(s.handled.verdict, Verdict::DeadLetter { .. })),
        "{ord3:#?}"
    );
}

/// Over all `runs`: each order executed exactly once, every one of `published` messages acked
/// once (none dead-lettered), and one row per order in the side-effect table.
pub async fn shipped_each_order_once(runs: &[&Tally], published: usize, shipping: &Shipping) {
    let all: Vec<&Seen> = runs.iter().flat_map(|r| &r.seen).collect();
    for order in ORDERS {
        let executed = all
            .iter()
            .filter(|s| {
                s.order_no.as_deref() == Some(order) && s.handled.outcome == Some(Outcome::Executed)
            })
            .count();
        assert_eq!(executed, 1, "{order} executed {executed} times: {all:#?}");
    }
    let acked: usize = runs
        .iter()
        .map(|r| settled_as(r, |v| *v == Verdict::Ack))
        .sum();
    assert_eq!(acked, published, "every message acked once");
    assert_eq!(
        shipping.shipped().await.unwrap(),
        one_row_per_order(&ORDERS)
    );
}

/// Messages no redelivery can fix, around one good order, as `(message id, payload)`:
/// `<p>-garbage` (no JSON), `<p>-blank` (a blank order number), `<p>-ord9` (ORD-9, shipped) and
/// `<p>-other` (another payload under ORD-9).
pub fn refused_messages(prefix: &str) -> Vec<(String, Vec<u8>)> {
    let order = |order_no: &str, qty| OrderMsg {
        order_no: order_no.into(),
        sku: "SKU-9".into(),
        qty,
    };
    let json = |msg: OrderMsg| serde_json::to_vec(&msg).unwrap();
    vec![
        (format!("{prefix}-garbage"), b"{not json".to_vec()),
        (format!("{prefix}-blank"), json(order(" ", 1))),
        (format!("{prefix}-ord9"), json(order("ORD-9", 1))),
        (format!("{prefix}-other"), json(order("ORD-9", 99))),
    ]
}

/// The consumer dead-lettered [`refused_messages`] at their first delivery (the unreadable
/// payload without an idempotent call, the blank order number refused by idem, the other payload
/// as a mismatch) and shipped ORD-9 once.
pub async fn refused_were_dead_lettered(run: &Tally, prefix: &str, shipping: &Shipping) {
    let of = |name: &str| {
        let id = format!("{prefix}-{name}");
        let seen: Vec<_> = run.seen.iter().filter(|s| s.message_id == id).collect();
        assert_eq!(seen.len(), 1, "{id} delivered once: {run:#?}");
        (seen[0].handled.outcome, seen[0].handled.verdict.clone())
    };
    let dead = |reason: &str| Verdict::DeadLetter {
        reason: reason.to_owned(),
    };
    let (outcome, verdict) = of("garbage");
    assert_eq!(outcome, None);
    assert!(
        matches!(&verdict, Verdict::DeadLetter { reason } if reason.starts_with("unreadable payload")),
        "{verdict:?}"
    );
    let (outcome, verdict) = of("blank");
    assert_eq!(outcome, Some(Outcome::Rejected));
    assert!(
        matches!(&verdict, Verdict::DeadLetter { reason } if reason.starts_with("refused")),
        "{verdict:?}"
    );
    assert_eq!(of("ord9"), (Some(Outcome::Executed), Verdict::Ack));
    assert_eq!(
        of("other"),
        (
            Some(Outcome::Mismatch),
            dead("another payload under a key already processed")
        )
    );
    assert_eq!(
        shipping.shipped().await.unwrap(),
        one_row_per_order(&["ORD-9"])
    );
}
