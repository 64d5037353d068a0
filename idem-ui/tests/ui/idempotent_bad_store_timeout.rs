use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

// A store timeout bounds each store step of the call: 0 would let no store answer, and one past
// `idem::MAX_DURATION` is refused as every duration is.
#[idempotent(
    biz = "PAY",
    key = "req.order_no",
    store = "sqlite",
    store_timeout = "0s"
)]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(
    biz = "PAY",
    key = "req.order_no",
    store = "sqlite",
    store_timeout = "5"
)]
async fn pay_again(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

fn main() {}
