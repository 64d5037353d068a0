use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

#[idempotent(biz = "PAY", key = req.order_no, store = "sqlite")]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = format!("{}-{}", req.user_id, req.order_no), store = "sqlite")]
async fn pay_formatted(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = order_no, store = "sqlite")]
async fn pay_by_number(order_no: u64) -> Result<Receipt, PayError> {
    Ok(Receipt { id: order_no })
}

fn main() {
    let req = PayReq {
        order_no: "A-1".into(),
        user_id: 7,
    };
    drop(pay(&req));
    drop(pay_formatted(&req));
    drop(pay_by_number(7));
}
