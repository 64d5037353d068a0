use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

pub struct Ledger;

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", tx = "ledger")]
async fn pay(ledger: &mut Ledger, req: &PayReq) -> Result<Receipt, PayError> {
    let _ = ledger;
    Ok(Receipt { id: req.user_id })
}

fn main() {}
