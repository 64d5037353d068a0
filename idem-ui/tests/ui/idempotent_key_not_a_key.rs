use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

pub struct OrderNo(pub String);

#[idempotent(biz = "PAY", key = "order", store = "sqlite")]
async fn pay(order: &OrderNo, req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt {
        id: req.user_id + order.0.len() as u64,
    })
}

fn main() {}
