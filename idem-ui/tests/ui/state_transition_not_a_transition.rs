use idem::sqlx::{Sqlite, Transaction};
use idem::{IdemError, state_transition};

include!("support/orders_minimal.rs");

#[state_transition(from = "WAIT_PAY", to = "PAID")]
pub fn pay(tx: &mut Transaction<'_, Sqlite>, order_no: &str) -> Result<(), IdemError> {
    Ok(())
}

fn main() {}
