use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

#[idempotent(
    biz = "PAY",
    key = "req.order_no",
    store = "sqlite",
    on_in_progress = "retry"
)]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(
    biz = "PAY",
    key = "req.order_no",
    store = "sqlite",
    on_in_progress = "wait(5)"
)]
async fn pay_waiting(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

fn main() {}
