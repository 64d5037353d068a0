// With `tx`, the records go where the transaction was begun (`store.begin()`): a `store` beside it
// could only disagree, and is refused at the option.
use idem::{SqliteTx, idempotent};

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

#[idempotent(biz = "PAY", key = "req.order_no", store = "other", tx = "tx")]
async fn pay(tx: &mut SqliteTx, req: &PayReq) -> Result<Receipt, PayError> {
    let _ = tx;
    Ok(Receipt { id: req.user_id })
}

fn main() {}
