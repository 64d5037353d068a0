use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

#[idempotent(
    biz = "PAY",
    key = "req.order_no",
    store = "sqlite",
    fingerprint = "request"
)]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(
    biz = "PAY",
    key = "req.order_no",
    store = "sqlite",
    fingerprint = "\"v1\""
)]
async fn pay_fixed(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

fn main() {}
