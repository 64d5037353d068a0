//! What the RabbitMQ and NATS consumer tests check alike, on what a consumer run saw and on the
//! `orders_shipped` table (not idem's counters). Used by `tests/mq_rabbitmq.rs` and
//! `tests/mq_nats.rs`, which both include `examples/mq_consumer.rs` as `mq_consumer`.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use idem::Outcome;

use crate::mq_consumer::{Seen, Shipping, Tally, Verdict};

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
        .filter(|s| s.handled.order_no.as_deref() == Some(order_no))
        .collect()
}

/// The first consumer died right after shipping ORD-2 (committed) and before its ack: the
/// delivery it died on.
pub async fn died_after_shipping_ord2<'a>(run: &'a Tally, shipping: &Shipping) -> &'a Seen {
    assert!(run.crashed, "consumer 1 never reached ORD-2: {run:#?}");
    let crashed = run.seen.last().unwrap();
    assert_eq!(crashed.handled.order_no.as_deref(), Some("ORD-2"));
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

/// ORD-3 failed on its first try and was requeued once; its redelivery (same message id) shipped
/// it, once.
pub fn failed_then_shipped_once(run: &Tally) {
    let ord3 = deliveries_of(run, "ORD-3");
    let first = ord3.first().expect("ORD-3 delivered");
    assert_eq!(first.handled.outcome, Some(Outcome::Failed), "{first:?}");
    assert_eq!(first.handled.verdict, Verdict::Requeue, "{first:?}");
    assert_eq!(run.requeued, 1, "one requeue: {run:#?}");
    assert!(
        run.seen
            .iter()
            .any(|s| s.message_id == first.message_id && s.redelivered),
        "the requeued message {} came back redelivered: {run:#?}",
        first.message_id
    );
    assert!(
        ord3.iter().all(|s| s.handled.verdict != Verdict::Reject),
        "{ord3:#?}"
    );
}

/// Over all `runs`: each order executed exactly once, every one of `published` messages acked
/// once, and one row per order in the side-effect table.
pub async fn shipped_each_order_once(runs: &[&Tally], published: usize, shipping: &Shipping) {
    let all: Vec<&Seen> = runs.iter().flat_map(|r| &r.seen).collect();
    for order in ORDERS {
        let executed = all
            .iter()
            .filter(|s| {
                s.handled.order_no.as_deref() == Some(order)
                    && s.handled.outcome == Some(Outcome::Executed)
            })
            .count();
        assert_eq!(executed, 1, "{order} executed {executed} times: {all:#?}");
    }
    let acked: usize = runs.iter().map(|r| r.acked).sum();
    assert_eq!(acked, published, "every message acked once");
    assert_eq!(
        shipping.shipped().await.unwrap(),
        one_row_per_order(&ORDERS)
    );
}
