// Two machines derived in one module: which one `from`/`to` belong to is ambiguous, so the
// transition must say `machine = …`.
use idem::sqlx::{Sqlite, Transaction};
use idem::{IdemError, StateMachine, Transition, state_transition};

#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(table = "orders", key = "order_no")]
pub enum OrderStatus {
    #[state(to(Paid))]
    WaitPay,
    #[state(terminal)]
    Paid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(table = "refunds", key = "refund_no")]
pub enum RefundStatus {
    #[state(to(Done))]
    Pending,
    #[state(terminal)]
    Done,
}

#[state_transition(from = "WAIT_PAY", to = "PAID")]
pub async fn pay(
    tx: &mut Transaction<'_, Sqlite>,
    order_no: &str,
) -> Result<Transition<(), OrderStatus>, IdemError> {
    Ok(())
}

fn main() {}
