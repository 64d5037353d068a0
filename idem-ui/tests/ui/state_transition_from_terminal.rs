use idem::sqlx::{Sqlite, Transaction};
use idem::{IdemError, Transition, state_transition};

include!("support/orders.rs");

#[state_transition(from = "REFUNDED", to = "PAID")]
pub async fn pay_after_refund(
    tx: &mut Transaction<'_, Sqlite>,
    order_no: &str,
) -> Result<Transition<(), OrderStatus>, IdemError> {
    Ok(())
}

fn main() {}
