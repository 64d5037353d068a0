use idem::{IdemError, Transition, state_transition};

include!("support/orders_minimal.rs");

#[state_transition(from = "WAIT_PAY", to = "PAID", tx = "txn")]
pub async fn pay(order_no: &str) -> Result<Transition<(), OrderStatus>, IdemError> {
    Ok(())
}

// Neither a transaction parameter nor a store.
#[state_transition(from = "WAIT_PAY", to = "PAID")]
pub async fn pay_alone(order_no: &str) -> Result<Transition<(), OrderStatus>, IdemError> {
    Ok(())
}

fn main() {}
