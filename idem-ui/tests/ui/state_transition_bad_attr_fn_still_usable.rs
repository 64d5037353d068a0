use idem::sqlx::{Sqlite, Transaction};
use idem::{IdemError, Transition, state_transition};

include!("support/orders.rs");

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
