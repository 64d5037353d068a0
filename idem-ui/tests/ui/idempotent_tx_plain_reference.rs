// A `&mut` to something that is no transaction at all (a counter, a `String`): one error, at `tx`.
use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx")]
async fn pay(tx: &mut i32, req: &PayReq) -> Result<Receipt, PayError> {
    *tx += 1;
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx")]
async fn pay_on_text(tx: &mut String, req: &PayReq) -> Result<Receipt, PayError> {
    tx.push('x');
    Ok(Receipt { id: req.user_id })
}

fn main() {}
