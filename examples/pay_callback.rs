//! A gateway's callback storm replayed with `#[state_transition]`: 47 payment callbacks, 26 of them a
//! concurrent, out-of-order retry storm with duplicates, late `PAID` after a refund and refund callbacks
//! for orders that never asked for one. Prints what each kind of delivery got and the audit, and
//! exits non-zero when the audit fails.
//!
//! ```sh
//! cargo run -p idem-suite --example pay_callback
//! ```

#[path = "../tests/tests/support/pay_callback.rs"]
mod scenario;

#[tokio::main]
async fn main() -> Result<(), scenario::ScenarioError> {
    let path = std::env::temp_dir().join("idem-pay-callback.db");
    let backend = scenario::Sqlite::open(&path).await?;
    let report = scenario::run(std::sync::Arc::new(backend)).await?;
    println!("deliveries: {}", report.deliveries);
    for (outcome, count) in &report.outcomes {
        println!("  {outcome:<16} {count}");
    }
    for (order, kind, current) in &report.rejected {
        println!("  rejected: {kind} for {order}, which is {current}");
    }
    println!("final states:");
    for (order, state) in &report.states {
        let coupons = report.coupons.get(order).copied().unwrap_or(0);
        println!("  {order} {state:<14} coupons {coupons}");
    }
    println!("ledger balance: {} cents", report.ledger_sum);
    match report.check() {
        Ok(()) => {
            println!("audit: no order moved backwards, one coupon per paid order, ledger balances")
        }
        Err(broken) => {
            println!("audit FAILED: {broken}");
            std::process::exit(1);
        }
    }
    Ok(())
}
