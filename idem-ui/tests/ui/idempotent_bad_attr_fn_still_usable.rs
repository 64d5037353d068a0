use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

// The attribute is wrong, but `pay` is still emitted as written: `main` compiles against it and
// the only error is the attribute's.
#[idempotent(biz = "PAY", key = "req.order_no", stor = "sqlite")]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

fn main() {
    let req = PayReq {
        order_no: "A-1".into(),
        user_id: 7,
    };
    let pending = pay(&req);
    drop(pending);
}
