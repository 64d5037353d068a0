// The machine of `Transition<T, Machine>` must be a `#[derive(StateMachine)]` enum.
use idem::{IdemError, Transition, state_transition};

pub struct OrderRow;

#[state_transition(from = "WAIT_PAY", to = "PAID", store = "sqlite")]
pub async fn pay(order_no: &str) -> Result<Transition<(), OrderRow>, IdemError> {
    Ok(())
}

fn main() {}
