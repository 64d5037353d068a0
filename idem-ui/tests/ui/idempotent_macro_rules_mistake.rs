// A wrapper macro with real mistakes in what its caller passed: each error points at the caller's
// token inside the wrapper's invocation, not at the wrapper's definition.
use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

macro_rules! handler {
    ($name:ident, $biz:literal, $key:expr) => {
        #[idempotent(biz = $biz, key = $key, store = "memory")]
        async fn $name(req: &PayReq) -> Result<Receipt, PayError> {
            Ok(Receipt { id: req.user_id })
        }
    };
}

handler!(pay, "PAY ORDER", "req.order_no");
handler!(refund, "REFUND", "reqq.order_no");

fn main() {}
