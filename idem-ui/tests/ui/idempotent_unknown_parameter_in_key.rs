use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

pub struct User {
    pub id: u64,
}

#[idempotent(biz = "PAY", key = "reqq.order_no", store = "sqlite")]
async fn pay(req: &PayReq, user: &User) -> Result<Receipt, PayError> {
    Ok(Receipt {
        id: req.user_id + user.id,
    })
}

#[idempotent(biz = "PAY", key = (usr.id, req.order_no), store = "sqlite")]
async fn pay_bare(req: &PayReq, user: &User) -> Result<Receipt, PayError> {
    Ok(Receipt {
        id: req.user_id + user.id,
    })
}

fn main() {}
