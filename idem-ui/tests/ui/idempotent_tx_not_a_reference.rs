// The transaction taken by value or by shared reference, where `tx` needs a `&mut` one: one error
// at the parameter's type, before the type checker would report it inside the generated code.
use idem::{SqliteTx, idempotent};

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx")]
async fn pay_by_value(tx: SqliteTx, req: &PayReq) -> Result<Receipt, PayError> {
    let _ = tx;
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx")]
async fn pay_shared(tx: &SqliteTx, req: &PayReq) -> Result<Receipt, PayError> {
    let _ = tx;
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx")]
async fn pay_by_number(tx: u64, req: &PayReq) -> Result<Receipt, PayError> {
    let _ = tx;
    Ok(Receipt { id: req.user_id })
}

fn main() {}
