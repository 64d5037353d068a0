use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

// The key is meant to be scoped by its caller, but the fn does not take the caller.
#[idempotent(biz = "PAY", key = "(caller.id, req.order_no)", store = "sqlite")]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

// Bare, the error points at the caller's name itself.
#[idempotent(biz = "PAY", key = (caller.id, req.order_no), store = "sqlite")]
async fn pay_bare(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

fn main() {}
