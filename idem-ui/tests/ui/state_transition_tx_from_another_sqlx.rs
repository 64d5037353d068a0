// A transaction type idem cannot run a transition in: here a stand-in for `sqlx::Transaction` from
// another sqlx version than the one idem re-exports (`idem::sqlx`), which is another type.
use idem::{IdemError, Transition, state_transition};

include!("support/orders_minimal.rs");

mod other_sqlx {
    pub struct Sqlite;
    pub struct Transaction<'c, DB>(pub &'c mut (), pub DB);
}

#[state_transition(from = "WAIT_PAY", to = "PAID")]
pub async fn pay(
    tx: &mut other_sqlx::Transaction<'_, other_sqlx::Sqlite>,
    order_no: &str,
) -> Result<Transition<(), OrderStatus>, IdemError> {
    Ok(())
}

fn main() {}
