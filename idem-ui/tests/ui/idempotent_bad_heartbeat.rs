// A heartbeat must beat more often than the lease runs out, has no lease to renew in a
// transaction, and is a duration or "off".
use idem::{SqliteTx, idempotent};

#[path = "support/pay.rs"]
mod pay_types;
use pay_types::*;

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", lease = "9s", heartbeat = "10s")]
async fn pay(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = "req.order_no", tx = "tx", heartbeat = "1s")]
async fn pay_in_tx(tx: &mut SqliteTx, req: &PayReq) -> Result<Receipt, PayError> {
    let _ = tx;
    Ok(Receipt { id: req.user_id })
}

#[idempotent(biz = "PAY", key = "req.order_no", store = "sqlite", heartbeat = "of")]
async fn misspelled_off(req: &PayReq) -> Result<Receipt, PayError> {
    Ok(Receipt { id: req.user_id })
}

fn main() {}
