use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

// A result is kept at most as long as its record: a `result_ttl` longer than the `ttl` (given, or
// the default 7d) is refused at the literal, as is a malformed one.
#[idempotent(
    biz = "PAY",
    key = "req.order_no",
    store = "sqlite",
    ttl = "1d",
    result_ttl = "2d"
)]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", result_ttl = "8d")]
async fn pay_default_ttl(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", result_ttl = "0s")]
async fn pay_zero(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

fn main() {}
