use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

// 3650 days is the longest duration idem takes (`idem::MAX_DURATION`): one day more is refused
// here, at compile time, with the same bound the runtime checks on `Call`.
#[idempotent(
    biz = "PAY",
    key = "req.order_no",
    store = "sqlite",
    ttl = "3651d",
    on_in_progress = "wait(87601h)"
)]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

fn main() {}
