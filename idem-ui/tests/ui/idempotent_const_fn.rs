use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite")]
const fn pay(req: &PayReq) -> Result<u64, PayError> {
    Ok(req.user_id)
}

fn main() {}
