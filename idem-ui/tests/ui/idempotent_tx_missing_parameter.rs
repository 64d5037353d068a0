use idem::idempotent;

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

use idem::SqliteTx;

#[idempotent(biz = "PAY", key = "req.order_no", tx = "txn")]
async fn pay(tx: &mut SqliteTx, req: &PayReq) -> Result<Receipt, PayError> {
    let _ = tx;
    Ok(Receipt { id: req.user_id })
}

fn main() {}
