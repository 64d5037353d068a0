use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

#[derive(Debug)]
pub struct BankError;

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite")]
async fn pay(req: &PayReq) -> Result<Receipt, BankError> {
    Ok(Receipt { id: req.user_id })
}

fn main() {}
