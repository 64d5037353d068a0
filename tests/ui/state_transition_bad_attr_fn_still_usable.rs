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

// The attribute is wrong (`to` is missing, `from` misspelled as an option), yet `pay` is still
// emitted as written: its callers compile and only the attribute's errors show.
#[state_transition(fro = "WAIT_PAY")]
pub async fn pay(
    tx: &mut Transaction<'_, Sqlite>,
    order_no: &str,
) -> Result<Transition<(), OrderStatus>, IdemError> {
    let _ = (tx, order_no);
    Ok(())
}

pub async fn caller(tx: &mut Transaction<'_, Sqlite>) -> bool {
    pay(tx, "A1").await.unwrap().is_success()
}

fn main() {}
