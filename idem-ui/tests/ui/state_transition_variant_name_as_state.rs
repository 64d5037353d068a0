// A transition names states as they are stored (`"WAIT_PAY"`, or a `#[state(name = "…")]`), not
// as Rust variants.
use idem::sqlx::{Sqlite, Transaction};
use idem::{IdemError, Transition, state_transition};

include!("support/orders.rs");

#[state_transition(from = "WaitPay", to = "PAID")]
pub async fn pay(
    tx: &mut Transaction<'_, Sqlite>,
    order_no: &str,
) -> Result<Transition<(), OrderStatus>, IdemError> {
    Ok(())
}

#[state_transition(from = "PAID", to = "REFUNDING")]
pub async fn refund(
    tx: &mut Transaction<'_, Sqlite>,
    order_no: &str,
) -> Result<Transition<(), OrderStatus>, IdemError> {
    Ok(())
}

fn main() {}
