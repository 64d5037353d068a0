// A machine with a mistake, used by transitions and by other code: the mistake is reported once,
// at its token, and nothing that uses the machine adds an error of its own.
use idem::sqlx::{Sqlite, Transaction};
use idem::{IdemError, StateMachine, Transition, state_transition};

#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(table = "orders", key = "order_no")]
pub enum OrderStatus {
    #[state(to(Payed))]
    WaitPay,
    #[state(terminal)]
    Paid,
}

#[state_transition(from = "WAIT_PAY", to = "PAID")]
pub async fn pay(
    tx: &mut Transaction<'_, Sqlite>,
    order_no: &str,
) -> Result<Transition<(), OrderStatus>, IdemError> {
    Ok(())
}

pub fn describe(status: OrderStatus) -> String {
    format!("{status} of {}", <OrderStatus as StateMachine>::TABLE)
}

// A machine missing its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
pub enum RefundStatus {
    #[state(to(Done))]
    Pending,
    #[state(terminal)]
    Done,
}

#[state_transition(from = "PENDING", to = "DONE", store = "sqlite")]
pub async fn refund(refund_no: &str) -> Result<Transition<(), RefundStatus>, IdemError> {
    Ok(())
}

fn main() {}
