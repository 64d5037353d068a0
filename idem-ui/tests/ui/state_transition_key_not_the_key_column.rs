use idem::sqlx::{Sqlite, Transaction};
use idem::{IdemError, Transition, state_transition};

include!("support/orders.rs");

#[state_transition(from = "WAIT_PAY", to = "PAID")]
pub async fn pay(
    tx: &mut Transaction<'_, Sqlite>,
    id: &str,
) -> Result<Transition<(), OrderStatus>, IdemError> {
    Ok(())
}

fn main() {}
