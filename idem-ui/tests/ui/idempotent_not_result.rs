use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite")]
async fn pay(req: &PayReq) -> Option<Receipt> {
    Some(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite")]
async fn pay_quietly(req: &PayReq) {
    let _ = req;
}

fn main() {}
