use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

pub struct Ledger;

#[idempotent(biz = "PAY", key = "req.order_no", tx = "ledger")]
async fn pay(ledger: &mut Ledger, req: &PayReq) -> Result<Receipt, PayError> {
    let _ = ledger;
    Ok(Receipt { id: req.user_id })
}

// A sqlx transaction (of idem's sqlx or any other version) does not carry the store: refused too.
#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx")]
async fn pay_in_sqlx_tx(
    tx: &mut idem::sqlx::Transaction<'_, idem::sqlx::Sqlite>,
    req: &PayReq,
) -> Result<Receipt, PayError> {
    let _ = tx;
    Ok(Receipt { id: req.user_id })
}

fn main() {}
