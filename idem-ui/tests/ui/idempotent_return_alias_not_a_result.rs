use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

// Generic like an alias of `Result`, but it is not one.
pub struct Outcome<T>(pub T);

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite")]
async fn pay(req: &PayReq) -> Outcome<Receipt> {
    Outcome(Receipt { id: req.user_id })
}

fn main() {}
