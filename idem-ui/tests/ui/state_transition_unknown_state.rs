use idem::sqlx::{Sqlite, Transaction};
use idem::{IdemError, StateMachine, Transition, state_transition};

#[derive(Debug, Clone, Copy, PartialEq, Eq, StateMachine)]
#[state_machine(table = "orders", key = "order_no", status = "status")]
pub enum OrderStatus {
    #[state(to(Paid, Closed))]
    WaitPay,
    #[state(to(Refunding))]
    Paid,
    #[state(name = "REFUND_PENDING", to(Refunded))]
    Refunding,
    #[state(terminal)]
    Refunded,
    #[state(terminal)]
    Closed,
}

#[state_transition(from = "WAIT_PAYY", to = "PAID")]
pub async fn pay(
    tx: &mut Transaction<'_, Sqlite>,
    order_no: &str,
) -> Result<Transition<(), OrderStatus>, IdemError> {
    Ok(())
}

#[state_transition(from = "WAIT_PAY", to = "PAYED")]
pub async fn pay_again(
    tx: &mut Transaction<'_, Sqlite>,
    order_no: &str,
) -> Result<Transition<(), OrderStatus>, IdemError> {
    Ok(())
}

fn main() {}
