use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

#[idempotent(biz = "PAY ORDER", key = "req.order_no", store = "sqlite")]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(
    biz = "PAY_FOR_AN_ORDER_PLACED_FROM_THE_MOBILE_APP",
    key = "req.order_no",
    store = "sqlite"
)]
async fn pay_mobile(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "", key = "req.order_no", store = "sqlite")]
async fn pay_nameless(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

fn main() {}
