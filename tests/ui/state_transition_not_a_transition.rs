use idem::sqlx::{Sqlite, Transaction};
use idem::{IdemError, StateMachine, state_transition};

#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(table = "orders", key = "order_no")]
pub enum OrderStatus {
    #[state(to(Paid))]
    WaitPay,
    #[state(terminal)]
    Paid,
}

#[state_transition(from = "WAIT_PAY", to = "PAID")]
pub fn pay(tx: &mut Transaction<'_, Sqlite>, order_no: &str) -> Result<(), IdemError> {
    Ok(())
}

fn main() {}
