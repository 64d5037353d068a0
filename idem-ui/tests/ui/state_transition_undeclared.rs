use idem::sqlx::{Sqlite, Transaction};
use idem::{IdemError, Transition, state_transition};

include!("support/orders.rs");

#[state_transition(from = "WAIT_PAY", to = "REFUNDED")]
pub async fn refund_unpaid(
    tx: &mut Transaction<'_, Sqlite>,
    order_no: &str,
) -> Result<Transition<(), OrderStatus>, IdemError> {
    Ok(())
}

fn main() {}
