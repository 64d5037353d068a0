//! The pay-callback example's scenario (a gateway's callback storm), asserted: no order moves backwards or
//! leaves a terminal state, one coupon per paid order, the ledger balances.

#[path = "support/pay_callback.rs"]
mod scenario;

use scenario::PayStatus;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_retry_storm_changes_nothing_it_should_not() {
    let path = std::env::temp_dir().join(format!("idem-pay-callback-{}.db", std::process::id()));
    let backend = scenario::Sqlite::open(&path).await.unwrap();
    let report = scenario::run(std::sync::Arc::new(backend)).await.unwrap();
    report.check().unwrap();
    assert_eq!(report.deliveries, 47);
    // 16 payments + 5 refunds applied before the storm; the storm applies nothing.
    assert_eq!(report.outcomes.get("applied"), Some(&21), "{report:?}");
    // Duplicates of 10 payments still PAID and of 5 refunds: repeats, answered with success.
    assert_eq!(
        report.outcomes.get("already_applied"),
        Some(&15),
        "{report:?}"
    );
    // Late PAID for the 5 refunded orders, refund callbacks for the 6 that never asked: refused.
    assert_eq!(report.outcomes.get("rejected"), Some(&11), "{report:?}");
    let late_paid = report
        .rejected
        .iter()
        .filter(|(_, kind, current)| *kind == "PAID callback" && *current == PayStatus::Refunded)
        .count();
    let bogus_refunds = report
        .rejected
        .iter()
        .filter(|(_, kind, current)| *kind == "REFUNDED callback" && *current == PayStatus::Paid)
        .count();
    assert_eq!((late_paid, bogus_refunds), (5, 6));
    let count = |state| report.states.values().filter(|s| **s == state).count();
    assert_eq!(count(PayStatus::Refunded), 5);
    assert_eq!(
        count(PayStatus::Paid),
        11,
        "no paid order was refunded by a retried callback"
    );
    assert_eq!(count(PayStatus::WaitPay), 4);
    assert_eq!(report.coupons.values().sum::<i64>(), 16);
    assert_eq!(report.ledger_sum, 11 * scenario::AMOUNT);
}
