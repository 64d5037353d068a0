use idem::{IdemError, StateMachine, Transition, state_transition};

#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(table = "orders", key = "order_no")]
pub enum OrderStatus {
    #[state(to(Paid))]
    WaitPay,
    #[state(terminal)]
    Paid,
}

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
